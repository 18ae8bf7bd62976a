/* A native backtrace on a fatal signal, on whichever thread it hits (LD_PRELOAD). */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)context;
    void *frames[64];
    char head[200];
    int n = snprintf(head, sizeof head, "\n[segv-trace] signal %d (%s) at address %p on thread %ld\n",
                     sig, strsignal(sig), info->si_addr, (long)syscall(SYS_gettid));
    if (write(2, head, (size_t)n) < 0) { /* nothing to do */ }
    backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

__attribute__((constructor)) static void install(void) {
    static char alt[1 << 16];
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt, .ss_flags = 0};
    void *warm[1];
    struct sigaction sa;
    backtrace(warm, 1); /* loads libgcc's unwinder now, not inside the handler */
    sigaltstack(&ss, NULL);
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
    sigaction(SIGILL, &sa, NULL);
    sigaction(SIGFPE, &sa, NULL);
}

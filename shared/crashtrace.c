/* A native backtrace on a fatal signal, on whichever thread it hits.
 * Loaded by shared/crashtrace.py (or LD_PRELOADed): the constructor installs the handler,
 * writing to fd 2 until duo_crashtrace_fd names another (a duplicate of stderr taken
 * before anything could redirect it: llama.cpp's loaders have pointed fd 2 at /dev/null).
 * It prints first, while the signal's own address is known, then hands the signal on to
 * the handler it replaced (Python's faulthandler: the Python frames). */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int trace_fd = 2;
static struct sigaction previous[NSIG];
static const int fatal[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};

void duo_crashtrace_fd(int fd) { trace_fd = fd; }

static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)context;
    void *frames[64];
    char head[200];
    int n = snprintf(head, sizeof head,
                     "\n[crash-trace] signal %d (%s) at address %p on thread %ld; native frames:\n",
                     sig, strsignal(sig), info->si_addr, (long)syscall(SYS_gettid));
    if (write(trace_fd, head, (size_t)n) < 0) { /* nothing to do */ }
    backtrace_symbols_fd(frames, backtrace(frames, 64), trace_fd);
    sigaction(sig, &previous[sig], NULL);
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
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
        sigaction(fatal[i], &sa, &previous[fatal[i]]);
}

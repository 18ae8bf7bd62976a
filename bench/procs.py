"""Real lead and back processes (for the bench and the real-model tests): start, wait, kill."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from shared.wire.scrape import read_samples

ROOT = Path(__file__).resolve().parent.parent
LEAD_CTX = 2048  # the context every lead here runs with (llama-server peers get the same)


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0,
               what: str = "condition") -> None:
    """Poll a condition until it holds; fail with what was awaited after `timeout`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def listening(port: int) -> bool:
    """Whether something accepts connections on the loopback port. Cheap: httpx.get makes
    a client (and an SSL context) each call, and polled every 10 ms while a lead starts it
    took most of a core from lead's calibration, which priced one token 1.7x too dear."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM when the process that started us dies, even by SIGKILL,
    so an interrupted test or benchmark leaves no lead or back behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class ProcExited(AssertionError):
    """A process that exited before it served; the message is its log's last line (its
    one-line error), the whole tail in `log`. (An AssertionError for the tests.)"""

    def __init__(self, name: str, log: str) -> None:
        lines = log.strip().splitlines()
        super().__init__(f"{name} exited at start: {lines[-1] if lines else 'no output'}")
        self.log = log[-2000:]


class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None,
                 log_name: str = "proc", cpus: str | None = None, cwd: Path = ROOT,
                 program: str = sys.executable) -> None:
        """`program` runs `args` (default: this Python, `args` naming a module)."""
        self.log_path = Path(os.environ.get("DUO_TEST_LOGS", "/tmp")) / \
            f"duo-{log_name}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = self.log_path.open("wb")
        pin = ["taskset", "-c", cpus] if cpus else []  # placement: emulate separate devices
        self.p = subprocess.Popen([*pin, program, *args], cwd=cwd, stdout=self._log,
                                  stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                  start_new_session=True, preexec_fn=_die_with_parent)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            self.p.send_signal(sig)
        self.p.wait(15)

    def stop(self) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
        self._log.close()

    def wait_serving(self, name: str, port: int, timeout: float) -> str:
        """Wait until /health on `port` answers 200 (raise if the process exits first);
        its URL."""
        url = f"http://127.0.0.1:{port}"

        def serving() -> bool:
            if not self.alive():
                raise ProcExited(name, self.log())
            try:
                return listening(port) and httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(serving, timeout, f"{name} to serve (log: {self.log_path})")
        return url


class Lead(Proc):
    def __init__(self, model: str = "smollm2-135m", *extra: str,
                 env: dict[str, str] | None = None, cpus: str | None = None,
                 cwd: Path = ROOT, sized: bool = True, program: str = sys.executable,
                 start_s: float = 300) -> None:
        """`cwd`: the checkout whose lead runs (another commit's, for an A/B); `sized`: one
        thread and LEAD_CTX tokens before `extra` (False: lead's own defaults, as a user
        starts it); `program`: the Python that runs it (another build's venv)."""
        self.port = free_port()
        sizes = ["--threads", "1", "--ctx-size", str(LEAD_CTX)] if sized else []
        super().__init__(["-m", "lead", "-m", model, "--host", "127.0.0.1", "--port",
                          str(self.port), *sizes, *extra], env, "lead", cpus, cwd, program)
        self.url = self.wait_serving("lead", self.port, start_s)  # a ceiling for hangs: a
        # busy machine's startup pricing took 45 s, a 32k context's cache 6 s more


class Back(Proc):
    def __init__(self, lead: Lead, model: str = "smollm2-135m", *extra: str,
                 cpus: str | None = None, cwd: Path = ROOT, program: str = sys.executable,
                 env: dict[str, str] | None = None) -> None:
        """`cwd`: the checkout whose back runs (another commit's, for an A/B)."""
        super().__init__(["-m", "back", "--lead", f"127.0.0.1:{lead.port}", "-m", model,
                          "--threads", "1", *extra], env, "back", cpus, cwd, program)
        self.lead = lead

    def wait_attached(self, timeout: float = 60) -> None:
        wait_until(lambda: "attached to lead" in self.log() or not self.alive(), timeout,
                   "back to attach")
        if not self.alive():
            raise ProcExited("back", self.log())


def metrics(lead: Lead | Proc) -> dict[str, float]:
    """Every sample of lead's /metrics, by name."""
    url = lead.url  # type: ignore[union-attr]
    return read_samples(httpx.get(f"{url}/metrics", timeout=5).text)


def metric(lead: Lead | Proc, name: str) -> float:
    return metrics(lead)[name]


# Simulated models (python -m bench.sim): exact greedy output, chosen costs.
SIM_TARGET = ["--call-s", "0.015", "--token-s", "0.0005"]  # ~65 tok/s alone
SIM_DRAFT = ["--agree", "0.9", "--call-s", "0.0015"]  # 10x cheaper per call


class SimLead(Proc):
    def __init__(self, port: int | None = None, *extra: str) -> None:
        """`extra`: bench.sim lead options (default: SIM_TARGET)."""
        self.port = port or free_port()
        super().__init__(["-m", "bench.sim", "lead", "--port", str(self.port),
                          *(extra or SIM_TARGET)], None, "simlead")
        self.url = self.wait_serving("simulated lead", self.port, 30)



class SimBack(Proc):
    def __init__(self, lead: SimLead, *extra: str) -> None:
        """`extra`: bench.sim back options (default: SIM_DRAFT)."""
        super().__init__(["-m", "bench.sim", "back", "--lead", f"127.0.0.1:{lead.port}",
                          *(extra or SIM_DRAFT)], None, "simback")

    def wait_attached(self, times: int = 1) -> None:
        wait_until(lambda: self.log().count("attached to lead") >= times, 30, "back to attach")

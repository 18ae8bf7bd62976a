"""python -m device.diagnose: why lead does not start on the device, in one call.

Run by scripts/device-check.sh when the serve step fails. The first H100 run (docs/gpu.md)
saw lead exit with SIGSEGV while loading, silently, where a bare process loading the same
model did not, and the same bare process crashed once lead's modules were imported first.
So each probe here is a short process with a native backtrace on a fatal signal
(shared/crashtrace.c, preloaded; frames in the built libraries resolved with addr2line):
bare loads in several import orders and on a thread, then lead itself with one thing
changed at a time. Each probe records its exit, its seconds, the trace and its last lines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from bench.procs import free_port
from shared.crashtrace import SOURCE

HERE = Path(__file__).parent
# A bare load and one evaluation; {before} is what the process imports first
LOAD = """import sys
{before}
from shared.llama.model import load_model
m = load_model(sys.argv[1], n_gpu_layers=int(sys.argv[2]), n_ctx=4096)
rows = m.evaluate(list(range(1, 33)), 32)
print("evaluated 32 tokens:", rows.shape, flush=True)
"""
# The same on a thread of its own (lead loads on its main thread, but runs the model on one)
ON_A_THREAD = """import sys, threading
done = []
run = threading.Thread(target=lambda: (exec(BODY, {{}}), done.append(True)))
run.start(); run.join()
sys.exit(0 if done else 1)
"""
FRAME = re.compile(r"^(?P<lib>/\S+)\((?P<sym>[^)]*)\)\[0x[0-9a-f]+\]$")


@dataclass
class Probe:
    """One process: a bare load (`before` imported first) or lead (`lead_args` added)."""

    name: str
    before: str | None = None
    lead_args: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    shell: str = ""  # run under `bash -c 'SHELL; exec ...'` (ulimit)


PROBES = [
    Probe("lead, as the serve step starts it", lead_args=[]),
    Probe("lead, CUDA hidden (CUDA_VISIBLE_DEVICES empty)", lead_args=[],
          env={"CUDA_VISIBLE_DEVICES": ""}),
    Probe("lead, no pinned host memory (GGML_CUDA_NO_PINNED=1)", lead_args=[],
          env={"GGML_CUDA_NO_PINNED": "1"}),
    Probe("lead --ctx-size 4096", lead_args=["--ctx-size", "4096"]),
    Probe("bare load", before=""),
    Probe("bare load of the draft, CPU only", before="DRAFT"),
    Probe("bare load after import lead.policy.cost", before="import lead.policy.cost"),
    Probe("bare load after lead's app module", before="import lead.server.app"),
    Probe("bare load on a thread", before="THREAD"),
    Probe("lead, CUDA graphs off", lead_args=[], env={"GGML_CUDA_DISABLE_GRAPHS": "1"}),
    Probe("lead, CUDA_LAUNCH_BLOCKING=1", lead_args=[], env={"CUDA_LAUNCH_BLOCKING": "1"}),
    Probe("lead --flash-attn off", lead_args=["--flash-attn", "off"]),
    Probe("lead --n-gpu-layers 0", lead_args=["--n-gpu-layers", "0"]),
    Probe("lead, ulimit -s unlimited", lead_args=[], shell="ulimit -s unlimited"),
    Probe("lead, MALLOC_PERTURB_=165", lead_args=[], env={"MALLOC_PERTURB_": "165"}),
]


@dataclass
class Outcome:
    name: str
    status: str  # served, evaluated, exit N, signal NAME, timeout, skipped
    seconds: float
    trace: list[str]
    tail: list[str]


def compile_trace(work: Path) -> Path | None:
    """shared/crashtrace.c as a preloadable library, or None where there is no C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    out = work / "crashtrace.so"
    done = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(SOURCE)],
                          capture_output=True, text=True)
    return out if done.returncode == 0 else None


def command(probe: Probe, a: argparse.Namespace, port: int) -> list[str]:
    if probe.lead_args is None:
        before = probe.before or ""
        code = LOAD.format(before=before)
        if before == "THREAD":
            code = f"BODY = {LOAD.format(before='')!r}\n" + ON_A_THREAD.format()
        model, ngl = (a.draft, 0) if before == "DRAFT" else (a.model, a.ngl)
        if before == "DRAFT":
            code = LOAD.format(before="")
        argv = [sys.executable, "-c", code, model, str(ngl)]
    else:
        args = ["--n-gpu-layers", str(a.ngl), "--ctx-size", "8192", *probe.lead_args]
        argv = [sys.executable, "-m", "lead", "-m", a.model, "--host", "127.0.0.1",
                "--port", str(port), "--parallel", "1", *args]
        argv = dedupe_flags(argv)
    if probe.shell:
        return ["bash", "-c", f'{probe.shell}; exec "$@"', "_", *argv]
    return argv


def dedupe_flags(argv: list[str]) -> list[str]:
    """The last value given for each --flag (a probe's own over the defaults)."""
    out: list[str] = []
    seen: dict[str, int] = {}
    i = 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv):
            if argv[i] in seen:
                out[seen[argv[i]] + 1] = argv[i + 1]
            else:
                seen[argv[i]] = len(out)
                out += argv[i:i + 2]
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def run(probe: Probe, a: argparse.Namespace, preload: Path | None, limit: float) -> Outcome:
    port = free_port()
    # llama.cpp's whole log: its last lines before a crash say which step it was in
    env = {**os.environ, "PYTHONFAULTHANDLER": "1", "DUO_LLAMA_LOG": "1", **probe.env}
    if preload is not None:
        env["LD_PRELOAD"] = f"{preload}:{env['LD_PRELOAD']}" if env.get("LD_PRELOAD") \
            else str(preload)
    with tempfile.TemporaryFile("w+") as log:
        t0 = time.monotonic()
        p = subprocess.Popen(command(probe, a, port), stdout=log, stderr=subprocess.STDOUT,
                             env=env, start_new_session=True)
        status = await_outcome(p, probe.lead_args is not None, port, limit)
        seconds = time.monotonic() - t0
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.seek(0)
        lines = log.read().splitlines()
    return Outcome(probe.name, status, round(seconds, 1), resolved(traced(lines)),
                   [line[:300] for line in lines[-15:]])


def await_outcome(p: subprocess.Popen, serving: bool, port: int, limit: float) -> str:
    """How the process ended, or "served" once lead answers a chat request."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        rc = p.poll()
        if rc is not None:
            return exited(rc, serving)
        if serving and answers(port):
            return "served"
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=0.5)
    return "timeout"


def exited(rc: int, serving: bool) -> str:
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return "evaluated" if rc == 0 and not serving else f"exit {rc}"


def answers(port: int) -> bool:
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=30, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def traced(lines: list[str]) -> list[str]:
    """The crash-trace block (its head line and the frames after it)."""
    for i, line in enumerate(lines):
        if line.startswith("[crash-trace]"):
            return lines[i:i + 40]
    return []


def resolved(trace: list[str]) -> list[str]:
    """Frames inside a library given as +offset, with addr2line's function and line."""
    addr2line = shutil.which("addr2line")
    out = []
    for line in trace:
        m = FRAME.match(line)
        if addr2line and m and m["sym"].startswith("+"):
            done = subprocess.run([addr2line, "-f", "-C", "-e", m["lib"], m["sym"][1:]],
                                  capture_output=True, text=True, timeout=10)
            where = " ".join(done.stdout.split())
            if done.returncode == 0 and not where.startswith("??"):
                line = f"{line}  {where}"
        out.append(line)
    return out


def diagnose(a: argparse.Namespace) -> dict:
    preload = compile_trace(Path(a.work))
    outcomes: list[Outcome] = []
    for probe in PROBES:
        left = a.deadline - time.time()
        if left < 10 or (probe.before == "DRAFT" and not a.draft):
            outcomes.append(Outcome(probe.name, "skipped", 0.0, [], []))
            continue
        outcomes.append(run(probe, a, preload, min(a.probe_s, left - 5)))
        print(f"{probe.name}: {outcomes[-1].status} in {outcomes[-1].seconds} s",
              file=sys.stderr, flush=True)
    crashed = next((p for p, o in zip(PROBES, outcomes, strict=True)
                    if o.status.startswith("signal")), None)
    gdb = under_gdb(crashed, a) if crashed else []
    return {"model": a.model, "ngl": a.ngl, "segvtrace": preload is not None,
            "probes": [asdict(o) for o in outcomes], "gdb": gdb}


def under_gdb(probe: Probe, a: argparse.Namespace) -> list[str]:
    """The first crashing probe again under gdb, address randomisation left on (as it
    crashed): every thread's backtrace; [] without gdb or time."""
    gdb, left = shutil.which("gdb"), a.deadline - time.time() - 5
    if gdb is None or left < 15:
        return []
    argv = command(probe, a, free_port())
    if argv[0] == "bash":  # a shell probe: gdb runs the program it would exec
        argv = argv[4:]
    env = {**os.environ, "DUO_LLAMA_LOG": "1", **probe.env}
    try:
        done = subprocess.run([gdb, "-q", "-batch", "-ex", "set disable-randomization off",
                               "-ex", "set pagination off", "-ex", "run",
                               "-ex", "thread apply all bt 30", "--args", *argv],
                              capture_output=True, text=True, env=env, timeout=min(left, 90))
    except subprocess.TimeoutExpired:
        return ["(gdb: no crash within the time left)"]
    lines = done.stdout.splitlines()
    start = next((i for i, line in enumerate(lines) if "received signal" in line), None)
    return lines[start:start + 200] if start is not None else lines[-20:]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.diagnose",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--ngl", type=int, default=-1)
    p.add_argument("--draft", default="", help="the draft model, for its CPU-only load")
    p.add_argument("--work", required=True, help="where the trace library is compiled")
    p.add_argument("--probe-s", type=float, default=45, help="each probe's limit")
    p.add_argument("--deadline", type=float, required=True, help="seconds since the epoch")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    Path(a.work).mkdir(parents=True, exist_ok=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(diagnose(a), indent=1))


if __name__ == "__main__":
    main()

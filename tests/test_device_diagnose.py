"""The device check's diagnosis (device/diagnose.py): the native trace a crash leaves, the
probes' commands, how an outcome is read, and its section of summary.md; then two probes
for real on SmolLM2 (a bare load evaluates, lead serves)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pytest

from device import diagnose, report
from device.diagnose import Probe, command, dedupe_flags, exited, resolved, traced
from shared.presets import PRESETS, cache_dir

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
CRASH_ON_A_THREAD = ("import ctypes, threading\n"
                     "t = threading.Thread(target=lambda: ctypes.string_at(0))\n"
                     "t.start(); t.join()")


@pytest.fixture(scope="module")
def segvtrace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not HAS_CC:
        pytest.skip("no C compiler here")
    built = diagnose.compile_trace(tmp_path_factory.mktemp("trace"))
    assert built is not None and built.is_file()
    return built


@pytest.mark.process
def test_a_crash_on_a_thread_leaves_a_native_trace(segvtrace: Path) -> None:
    done = subprocess.run([sys.executable, "-c", CRASH_ON_A_THREAD], capture_output=True,
                          text=True, env={"LD_PRELOAD": str(segvtrace), "PATH": "/usr/bin"})
    assert done.returncode == -11
    trace = traced(done.stderr.splitlines())
    assert trace[0].startswith("[crash-trace] signal 11") and "address (nil)" in trace[0]
    assert any("_ctypes" in frame for frame in trace[1:]), trace  # the frame that faulted


@pytest.mark.process
def test_a_process_that_does_not_crash_is_unchanged_by_the_trace(segvtrace: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "print(6 * 7)"], capture_output=True,
                          text=True, env={"LD_PRELOAD": str(segvtrace), "PATH": "/usr/bin"})
    assert (done.returncode, done.stdout, done.stderr) == (0, "42\n", "")


def test_frames_in_a_library_are_resolved_where_addr2line_knows_them() -> None:
    lines = ["[crash-trace] signal 11 (Segmentation fault) at address 0x8 on thread 7",
             "/nonexistent/libggml-cuda.so(+0x1234)[0x7f0000001234]",
             "/lib/libc.so.6(abort+0x10)[0x7f0000000010]"]
    out = resolved(lines)
    assert out[0] == lines[0] and out[2] == lines[2]  # only +offset frames are looked up
    assert out[1].startswith(lines[1])  # a file addr2line cannot read keeps its line


def test_the_trace_is_found_among_a_process_s_lines() -> None:
    lines = ["loading", "flash attention on", "", "[crash-trace] signal 11 at (nil)",
             "/a(+0x1)[0x2]"]
    assert traced(lines) == lines[3:] and traced(["no crash"]) == []


def test_an_outcome_reads_as_a_person_would_say_it() -> None:
    assert exited(-11, serving=True) == "signal SIGSEGV"
    assert exited(0, serving=False) == "evaluated" and exited(0, serving=True) == "exit 0"
    assert exited(1, serving=False) == "exit 1"


def test_a_probe_s_flags_replace_the_defaults() -> None:
    args = Namespace(model="m.gguf", ngl=-1)
    argv = command(Probe("x", lead_args=["--ctx-size", "4096", "--parallel", "2"]), args, 5000)
    assert argv[argv.index("--ctx-size") + 1] == "4096" and argv.count("--ctx-size") == 1
    assert argv[argv.index("--n-gpu-layers") + 1] == "-1" and "--parallel" in argv
    assert dedupe_flags(["-m", "x", "--a", "1", "--a", "2"]) == ["-m", "x", "--a", "2"]
    shell = command(Probe("x", lead_args=[], shell="ulimit -s unlimited"), args, 5000)
    assert shell[:3] == ["bash", "-c", 'ulimit -s unlimited; exec "$@"'] and "lead" in shell
    bare = command(Probe("x", before="import numpy"), args, 5000)
    assert bare[-2:] == ["m.gguf", "-1"] and "import numpy\nfrom shared.llama.model" in bare[2]


def test_the_draft_probe_loads_the_draft_on_the_cpu() -> None:
    args = Namespace(model="target.gguf", ngl=-1, draft="draft.gguf")
    argv = command(Probe("draft", before="DRAFT"), args, 5000)
    assert argv[-2:] == ["draft.gguf", "0"] and "DRAFT" not in argv[2]


@pytest.mark.process
@pytest.mark.skipif(shutil.which("gdb") is None, reason="no gdb here")
def test_a_crashing_probe_is_run_again_under_gdb_with_every_threads_frames() -> None:
    args = Namespace(model="m.gguf", ngl=0, draft="", deadline=time.time() + 120)
    crash = Probe("crash", before="import ctypes; ctypes.string_at(0)")
    lines = diagnose.under_gdb(crash, args)
    assert "received signal SIGSEGV" in lines[0], lines
    assert any(line.startswith("#0") for line in lines), lines


def test_the_summary_shows_each_probe_and_the_first_trace() -> None:
    data = {"diagnose": {"probes": [
        {"name": "lead", "status": "signal SIGSEGV", "seconds": 3.1,
         "trace": ["[crash-trace] signal 11", "/x/libllama.so(+0x10)[0x1]  llama_decode"],
         "tail": []},
        {"name": "bare load", "status": "evaluated", "seconds": 2.0, "trace": [], "tail": []}]}}
    text = report.markdown(data)
    assert "| lead | signal SIGSEGV | 3.1 |" in text and "| bare load | evaluated | 2.0 |" in text
    assert "Native trace (lead):" in text and "llama_decode" in text
    assert "Why lead did not serve" not in report.markdown({})
    data["diagnose"]["gdb"] = ["Thread 7 received signal SIGSEGV", "#0  0x1 in f ()"]
    assert "under gdb (ASLR on)" in report.markdown(data) and "#0  0x1 in f" in \
        report.markdown(data)


@pytest.mark.real
@pytest.mark.parametrize("probe", [Probe("bare load", before=""),
                                   Probe("bare load on a thread", before="THREAD"),
                                   Probe("lead", lead_args=["--no-calibrate"])])
def test_probes_on_a_working_build_load_and_serve(probe: Probe, tmp_path: Path) -> None:
    path = cache_dir() / PRESETS["smollm2-135m"].filename
    if not path.is_file():
        pytest.skip("SmolLM2 not installed: make models")
    args = Namespace(model=str(path), ngl=0)
    outcome = diagnose.run(probe, args, diagnose.compile_trace(tmp_path), limit=120)
    wanted = "served" if probe.lead_args is not None else "evaluated"
    assert outcome.status == wanted, outcome
    assert outcome.trace == [] and outcome.seconds < 120


def test_probes_stop_at_the_deadline(tmp_path: Path) -> None:
    args = Namespace(model="m.gguf", ngl=0, work=str(tmp_path), probe_s=45,
                     deadline=time.time() + 5)
    found = diagnose.diagnose(args)
    assert [p["status"] for p in found["probes"]] == ["skipped"] * len(diagnose.PROBES)

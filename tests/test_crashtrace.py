"""A fatal signal names its frames (shared/crashtrace.py): Python's and the native ones,
on any thread, with fd 2 pointed at /dev/null when it strikes (as llama-cpp-python's
loaders do) — and lead's own start, faulted inside llama.cpp's model load."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.procs import free_port

HAS_CC = shutil.which("cc") is not None or shutil.which("gcc") is not None
ROOT = Path(__file__).resolve().parent.parent
SILENCE_AND_FAULT = """
def silence_and_fault():
    import ctypes, os
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # as a quiet loader does
    ctypes.string_at(0)
"""
ON_A_THREAD = f"""
import threading
from shared import crashtrace
print("native:", crashtrace.install(), flush=True)
{SILENCE_AND_FAULT}
t = threading.Thread(target=silence_and_fault, name="worker")
t.start(); t.join()
"""
# lead started as `python -m lead` starts it, its model load made to fault from inside
# llama.cpp: the load's progress callback (called by libllama's loader) faults
IN_LEADS_MODEL_LOAD = """
import sys, llama_cpp
{silence_and_fault}
@llama_cpp.llama_progress_callback
def progress(fraction, data):
    silence_and_fault()
    return True
real = llama_cpp.llama_model_load_from_file
def load(path, params):
    params.progress_callback = progress
    return real(path, params)
llama_cpp.llama_model_load_from_file = load
sys.argv = ["lead", "-m", "smollm2-135m", "--port", "{port}", "--ctx-size", "512"]
from lead.__main__ import main
main()
"""


def run(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}  # (no huge-page restart)
    env.pop("PYTHONFAULTHANDLER", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def native_frames(stderr: str) -> list[str]:
    lines = stderr.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("[crash-trace]")]
    assert heads, stderr[-3000:]
    return lines[heads[0]:]


@pytest.mark.process
@pytest.mark.skipif(not HAS_CC, reason="no C compiler here for the native trace")
def test_a_fault_on_a_thread_with_stderr_silenced_prints_both_traces() -> None:
    done = run(ON_A_THREAD)
    assert done.returncode == -11 and done.stdout == "native: True\n"
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "in silence_and_fault" in done.stderr  # Python's frame that faulted
    frames = native_frames(done.stderr)
    assert frames[0].startswith("[crash-trace] signal 11") and "address (nil)" in frames[0]
    assert any("_ctypes" in frame for frame in frames[1:]), frames


@pytest.mark.process
def test_without_a_compiler_python_frames_still_print() -> None:
    code = ON_A_THREAD.replace("from shared import crashtrace",
                               "from shared import crashtrace\n"
                               "crashtrace.library = lambda: None")
    done = run(code)
    assert done.returncode == -11 and done.stdout == "native: False\n"
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert "[crash-trace]" not in done.stderr


@pytest.mark.real
@pytest.mark.skipif(not HAS_CC, reason="no C compiler here for the native trace")
def test_a_fault_inside_leads_model_load_names_its_frames() -> None:
    code = IN_LEADS_MODEL_LOAD.format(silence_and_fault=SILENCE_AND_FAULT, port=free_port())
    done = run(code)
    assert done.returncode == -11, done.stderr[-3000:]
    assert "Fatal Python error: Segmentation fault" in done.stderr
    # Python: lead's start down to the load; native: llama.cpp's loader under the callback
    assert "in load_weights" in done.stderr and "in create_app" in done.stderr
    frames = native_frames(done.stderr)
    assert any("libllama" in frame for frame in frames[1:]), frames
    print(done.stderr)  # the trace, as a user would see it (pytest -s)

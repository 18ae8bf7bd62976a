"""A fatal signal names its frames: Python's (faulthandler, every thread) and the native
ones of the thread that faulted (shared/crashtrace.c), during a model load too.

Both write to a duplicate of stderr taken at `install`, so a loader that points fd 2 at
/dev/null (llama-cpp-python's do, around llama.cpp's backend and model loading) does not
silence them. The C part is compiled once per source into the cache (any C compiler; the
one that built llama.cpp); without one, Python's frames alone, and one line says so.
"""

from __future__ import annotations

import ctypes
import faulthandler
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import IO

from shared.presets import cache_dir

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("crashtrace.c")
_kept: list[object] = []  # the stream and library live as long as the process


def library() -> Path | None:
    """The compiled trace library (built here if missing), or None without a compiler."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    built = cache_dir() / "native" / f"crashtrace-{digest}.so"
    if built.exists():
        return built
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent) as work:
        scratch = Path(work) / built.name
        done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(scratch),
                               str(SOURCE)], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            log.warning("no native crash trace: %s failed: %s", compiler,
                        done.stderr.strip().splitlines()[-1:] or done.returncode)
            return None
        os.replace(scratch, built)  # atomic: a lead and a back may build it at once
    return built


def install() -> bool:
    """Trace fatal signals from here on; True where native frames will print too."""
    stream: IO[str] = os.fdopen(os.dup(2), "w", buffering=1)
    _kept.append(stream)
    faulthandler.enable(file=stream, all_threads=True)
    native = _load_native(stream.fileno())  # over faulthandler, which it hands on to
    if not native:
        log.info("a crash will show Python's frames only (no C compiler for the native "
                 "trace: set CC)")
    return native


def _load_native(fd: int) -> bool:
    try:
        path = library()
        lib = ctypes.CDLL(str(path)) if path else None
    except OSError as exc:
        log.warning("no native crash trace: %s", exc)
        return False
    if lib is None:
        return False
    lib.duo_crashtrace_fd(ctypes.c_int(fd))
    _kept.append(lib)
    return True

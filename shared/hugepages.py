"""Transparent huge pages for the model's buffers, where the kernel gives them only on request.

llama.cpp's CPU backend copies much of a model's weights into buffers of its own (repacked
for the CPU's vector instructions) and keeps its KV cache and scratch there too, all from
malloc. Where the kernel's THP mode is `madvise` (Debian's and Ubuntu's default), those
buffers stay in 4 KiB pages unless asked for, and decoding then ran 5-13 % slower, the
more so in the first such process started (docs/benchmarks.md, 2026-11-25). glibc asks for
huge pages for its large allocations with the tunable glibc.malloc.hugetlb=1, read when a
process starts: so lead and back start again, once, with it set.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

TUNABLE = "glibc.malloc.hugetlb=1"
THP_MODE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
OPT_OUT = "DUO_HUGE_PAGES"  # set to 0 to keep the process as it started


def wanted(environ: dict[str, str] | os._Environ[str], mode: str | None) -> bool:
    """Whether a restart with the tunable would give huge pages that the process lacks:
    the kernel gives them on request only, and nobody asked yet (or said not to)."""
    if environ.get(OPT_OUT, "1") == "0" or "glibc.malloc.hugetlb" in environ.get(
            "GLIBC_TUNABLES", ""):
        return False
    return mode is not None and "[madvise]" in mode


def with_tunable(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The environment with the tunable added to any already set."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return {**environ, "GLIBC_TUNABLES": f"{tunables}:{TUNABLE}" if tunables else TUNABLE}


def without_tunable(environ: dict[str, str] | os._Environ[str]) -> str:
    """GLIBC_TUNABLES with the tunable taken out (for a peer run with its own defaults)."""
    parts = environ.get("GLIBC_TUNABLES", "").split(":")
    return ":".join(p for p in parts if p and not p.startswith("glibc.malloc.hugetlb"))


def _thp_mode() -> str | None:
    """The kernel's THP mode line, on glibc Linux (None elsewhere)."""
    try:
        if "glibc" not in (os.confstr("CS_GNU_LIBC_VERSION") or ""):
            return None
        return THP_MODE.read_text()
    except (OSError, ValueError, AttributeError):
        return None


def restart_with_huge_pages(module: str, argv: list[str]) -> None:
    """Start `python -m module argv` again with the tunable, where that helps (on glibc
    Linux whose THP mode is madvise); else return and go on as started."""
    if not wanted(os.environ, _thp_mode()):
        return
    logging.getLogger(module).debug("restarting with %s (transparent huge pages)", TUNABLE)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *argv], with_tunable(os.environ))

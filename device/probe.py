"""python -m device.probe GPU OUT: the machine in one line and a JSON file (GPU: what
nvidia-smi said, or 'none')."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def main(argv: list[str] | None = None) -> None:
    gpu, out = (argv or sys.argv[1:])[:2]
    info = {"gpu": gpu, "cpus": os.cpu_count(), "cpu": cpu_model(),
            "python": platform.python_version(), "machine": platform.machine(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)}
    Path(out).write_text(json.dumps(info, indent=1))
    print(f"{gpu}; {info['cpus']} CPUs ({info['cpu']}), {info['memory_gib']} GiB; "
          f"Python {info['python']}")


if __name__ == "__main__":
    main()

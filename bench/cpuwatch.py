"""How much CPU other processes took while the benchmark ran.

On a machine of two cores, one busy process beside a decoder of two threads made every
such decoder, the raw loop included, several times slower in bursts (docs/benchmarks.md),
so figures taken then mean little. `LoadWatch` reads /proc: the machine's busy time less
that of this process and its descendants.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


def foreign_share(busy_s: float, ours_s: float, wall_s: float, n_cpus: int) -> float:
    """Share of the CPUs' time that others used: (busy - ours) / (wall x CPUs), in [0, 1]."""
    if wall_s <= 0 or n_cpus < 1:
        return 0.0
    return min(max((busy_s - ours_s) / (wall_s * n_cpus), 0.0), 1.0)


def parse_stat(text: str) -> tuple[int, list[int]]:
    """/proc/PID/stat -> (parent pid, [utime, stime, cutime, cstime]) in clock ticks; the
    command name, in parentheses, may itself hold spaces and parentheses."""
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), [int(f) for f in fields[11:15]]


def machine_busy_ticks(text: str) -> int:
    """Busy ticks of every CPU from /proc/stat's first line (all but idle and iowait)."""
    values = [int(v) for v in text.splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return user + nice + system + irq + softirq + steal


@dataclass
class _Sample:
    wall: float
    busy: int
    ours: int


class LoadWatch:
    """Started on creation; `share()`: what others used since, of every CPU's time."""

    def __init__(self) -> None:
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._start = self._sample()

    def share(self) -> float | None:
        """None where /proc cannot be read (not Linux)."""
        if self._start is None:
            return None
        now = self._sample()
        if now is None:
            return None
        return foreign_share((now.busy - self._start.busy) / self._tick,
                             (now.ours - self._start.ours) / self._tick,
                             now.wall - self._start.wall, os.cpu_count() or 1)

    def _sample(self) -> _Sample | None:
        try:
            busy = machine_busy_ticks((PROC / "stat").read_text())
        except OSError:
            return None
        return _Sample(time.monotonic(), busy, sum(_our_ticks().values()))


def _our_ticks() -> dict[int, int]:
    """CPU ticks of this process and every live descendant, children they waited for
    included."""
    family: dict[int, tuple[int, int]] = {}  # pid -> (parent, ticks)
    for entry in PROC.iterdir():
        if entry.name.isdigit():
            try:
                parent, ticks = parse_stat((entry / "stat").read_text())
            except (OSError, ValueError, IndexError):  # ended meanwhile
                continue
            family[int(entry.name)] = (parent, sum(ticks))
    ours = {os.getpid()}
    grew = True
    while grew:
        more = {pid for pid, (parent, _) in family.items() if parent in ours} - ours
        ours |= more
        grew = bool(more)
    return {pid: family[pid][1] for pid in ours if pid in family}


def caveat(share: float | None) -> str | None:
    """A line for the report where others took more than 5 % of the CPUs."""
    if share is None or share <= 0.05:
        return None
    return (f"caveat: other processes used {share:.0%} of this machine's CPU time during the "
            "run, so its timings are noisy; compare only figures measured side by side, or "
            "run again on a quiet machine")

"""Where a role runs on its host: which CPUs, how many threads, at what priority.

Lead publishes its host, CPUs and threads in /duo/info. A back on the same host drafts
on cores lead does not use; where there are none it sits out: attached, but computing
nothing while lead generates, since every cycle it took would be lead's (idle priority
was not enough: see docs/placement.md). `choose_back` and `choose_lead` are pure;
`apply` is the edge that sets affinity and scheduling policy.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    cpus: frozenset[int] | None  # pin to these; None: every CPU the process may use
    threads: int
    sit_out: bool = False  # compute nothing while lead generates (idle priority for the rest)
    reason: str = ""
    beside_lead: bool = False  # on lead's host: its work slows lead, so only when asked

    def describe(self) -> str:
        if self.sit_out:
            return f"sitting out: {self.reason}"
        where = f"CPUs {format_cpus(self.cpus)}" if self.cpus is not None else "any CPU"
        return f"{self.threads} thread{'s' * (self.threads != 1)} on {where}: {self.reason}"


def parse_cpus(text: str) -> frozenset[int]:
    """'0-3,6' -> {0, 1, 2, 3, 6}; a one-line error for anything else."""
    cpus: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise PlacementError(f"not a CPU list: {text!r} (expected e.g. 0-3,6)")
        first, last = int(lo), int(hi) if dash else int(lo)
        if last < first:
            raise PlacementError(f"not a CPU list: {text!r} ({part} runs backwards)")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """{0, 1, 2, 3, 6} -> '0-3,6'."""
    ordered = sorted(cpus)
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def _pinned(flag: str, allowed: frozenset[int]) -> frozenset[int]:
    cpus = parse_cpus(flag)
    if not cpus <= allowed:
        raise PlacementError(f"--cpus {flag}: CPUs {format_cpus(cpus - allowed)} are not "
                             f"available to this process (it may use {format_cpus(allowed)})")
    return cpus


def choose_lead(flag: str, threads: int, allowed: frozenset[int], on_gpu: bool = False
                ) -> Placement:
    """Lead: every CPU it may use unless --cpus names some, or --threads asks for fewer
    (then the first that many); one thread per CPU by default. `on_gpu` (every layer
    offloaded): one CPU for its own work, the rest left to backs."""
    if flag in ("", "all") and on_gpu:
        return Placement(frozenset({min(allowed)}), threads or 1, reason=(
            "every layer is offloaded (GPU or --rpc); the other CPUs are left to backs"))
    if flag in ("", "all") and 0 < threads < len(allowed):
        return Placement(frozenset(sorted(allowed)[:threads]), threads, reason=(
            f"--threads {threads}: that many CPUs, the rest left to backs"))
    if flag in ("", "all"):
        return Placement(None, threads or len(allowed), reason="every core of this process")
    cpus = _pinned(flag, allowed)
    return Placement(cpus, threads or len(cpus), reason="as --cpus asks")


@dataclass(frozen=True)
class LeadPlace:
    """What lead says of its placement in /duo/info."""

    host: str
    cpus: frozenset[int]
    threads: int

    @classmethod
    def of(cls, placement: Placement, allowed: frozenset[int]) -> LeadPlace:
        """What a lead placed so on this host publishes (unpinned: every CPU it may use)."""
        return cls(host_id(), placement.cpus or allowed, placement.threads)


def choose_back(flag: str, threads: int, allowed: frozenset[int], my_host: str,
                lead: LeadPlace | None) -> Placement:
    """--cpus auto: beside a lead on this host, the cores it leaves free, else idle priority;
    'all': every CPU; a list: those CPUs. --threads 0: one thread per CPU it drafts on."""
    beside = lead is not None and lead.host == my_host  # its work takes lead's CPU time
    if flag == "all":
        return Placement(None, threads or len(allowed), reason="--cpus all", beside_lead=beside)
    if flag != "auto":
        cpus = _pinned(flag, allowed)
        return Placement(cpus, threads or len(cpus), reason="as --cpus asks", beside_lead=beside)
    if lead is None or not beside:
        return Placement(None, threads or len(allowed), reason="lead is on another host")
    spare = allowed - lead.cpus
    if spare:
        return Placement(spare, threads or len(spare), beside_lead=True, reason=(
            f"lead uses CPUs {format_cpus(lead.cpus)} of this host; the back takes the rest"))
    return Placement(None, threads or 1, sit_out=True, beside_lead=True, reason=(
        f"lead uses every core of this host ({format_cpus(lead.cpus)}), and drafting here "
        "would slow it; start lead with --cpus to leave the back cores, or run the back on "
        "another machine"))


# --- the edge: this process ---
def host_id() -> str:
    """Equal for two processes that share CPUs: the kernel's boot id (containers on one
    kernel share it), else the host name."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return socket.gethostname()


def allowed_cpus() -> frozenset[int]:
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def apply(placement: Placement, allowed: frozenset[int]) -> None:
    """Pin every thread of this process (and those it starts later) and set its policy.
    Where the OS has no such calls (macOS), say so and carry on unpinned."""
    if not hasattr(os, "sched_setaffinity"):
        if placement.cpus is not None or placement.sit_out:
            log.warning("this OS cannot pin threads or lower their priority; running unpinned")
        return
    cpus = placement.cpus if placement.cpus is not None else allowed
    policy = os.SCHED_IDLE if placement.sit_out else os.SCHED_OTHER
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, cpus)
            os.sched_setscheduler(tid, policy, os.sched_param(0))
        except (ProcessLookupError, PermissionError) as exc:  # a thread that just ended
            log.debug("thread %d: %s", tid, exc)


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]

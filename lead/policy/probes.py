"""When lead asks quiet backs for drafts anyway: probes, at gaps that grow while nothing pays.

Reasoning and measurements: docs/cost-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class AfterProbe(Enum):
    """What a probe found, which sets the gap before the next one."""

    PAYS = "pays"  # a draft length pays: lead speculates, the gap stays
    NOTHING_PAYS = "nothing pays"  # at the current estimate: twice the gap, up to max_gap
    PRICED_OUT = "priced out"  # not even perfect drafts pay at this slowdown: max_gap
    HUSHED = "hushed"  # and the back slows lead past hush_at: doubling up to max_hushed_gap


@dataclass
class ProbeSchedule:
    """Steps counted while no draft length pays, and the probes they call for. A probe is
    open while `probing` > 0: it lasts until `outcomes` drafts were compared with what lead
    emitted, or `max_steps` steps."""

    first_gap: int = 8  # quiet steps before the first probe once speculation stops
    max_gap: int = 32  # the longest gap between probes
    outcomes: int = 4  # drafts a probe wants compared
    max_steps: int = 16  # a probe ends after this many steps even without its outcomes
    max_hushed_gap: int = 512  # the longest gap between probes while backs are hushed
    probing: int = 0  # outcomes the open probe still wants; 0: none open
    age: int = 0  # steps the open probe has been open
    since: int = 0  # steps since the last probe ended, or speculation stopped
    gap: int = field(init=False)  # quiet steps before the next probe

    def __post_init__(self) -> None:
        self.gap = self.first_gap

    def speculating(self) -> None:
        """A draft length pays: once it stops paying, probe after `first_gap` steps."""
        self.since, self.gap = 0, self.first_gap

    def quiet_step(self) -> bool:
        """A step with no probe open and nothing paying; True when a probe is due."""
        self.since += 1
        return self.since >= self.gap

    def start(self) -> None:
        self.probing, self.age = self.outcomes, 0

    def probe_step(self) -> bool:
        """A step with a probe open; True when it has run out of steps (a back with nothing
        to offer would otherwise keep it open and be woken per token)."""
        self.age += 1
        return self.age >= self.max_steps

    def outcome(self) -> bool:
        """A draft compared while a probe is open; True when it has all it wanted."""
        self.probing -= 1
        return self.probing == 0

    def end(self, found: AfterProbe) -> None:
        """Close the open probe; `found` sets the gap before the next one."""
        self.probing, self.since = 0, 0
        if found is AfterProbe.HUSHED:
            self.gap = min(max(2 * self.gap, self.max_gap), self.max_hushed_gap)
        elif found is AfterProbe.PRICED_OUT:
            self.gap = self.max_gap
        elif found is AfterProbe.NOTHING_PAYS:
            self.gap = min(2 * self.gap, self.max_gap)

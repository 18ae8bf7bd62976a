"""How long the back waits before trying lead again, and how it counts lead's outages."""

from __future__ import annotations


class Backoff:
    """Waits that double from `first` up to `most` while lead stays unreachable; an
    outage is counted (and logged by the caller) once, at its first failure."""

    def __init__(self, first: float = 0.25, most: float = 5.0) -> None:
        self.first, self.most = first, most
        self.outages = 0
        self._delay = first
        self._down_since: float | None = None

    def failed(self, now: float) -> tuple[bool, float]:
        """(whether this failure begins an outage, seconds to wait before trying again)."""
        began = self._down_since is None
        if began:
            self._down_since = now
            self.outages += 1
        wait, self._delay = self._delay, min(self._delay * 2, self.most)
        return began, wait

    def reached(self, now: float) -> float | None:
        """Lead answered: how long it was unreachable, or None if it was not."""
        down, self._down_since, self._delay = self._down_since, None, self.first
        return None if down is None else now - down

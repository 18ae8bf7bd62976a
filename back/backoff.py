"""How long the back waits before trying lead again, and how it counts lead's outages."""

from __future__ import annotations


class Backoff:
    """Waits that double from `first` up to `most` while lead stays unreachable; an
    outage is counted (and logged by the caller) once, at its first failure. Handshakes
    that lead answers with no usable state after them (`steady` never set) each end an
    outage, so the wait would start over at `first` every time: their own count doubles it
    too (`flaps`)."""

    def __init__(self, first: float = 0.25, most: float = 5.0) -> None:
        self.first, self.most = first, most
        self.outages = 0
        self.steady = False  # a state was taken since the last handshake
        self.flaps = 0  # failures in a row with no state taken between them
        self._delay = first
        self._down_since: float | None = None

    def failed(self, now: float) -> tuple[bool, float]:
        """(whether this failure begins an outage, seconds to wait before trying again)."""
        began = self._down_since is None
        if began:
            self._down_since = now
            self.outages += 1
        wait, self._delay = self._delay, min(self._delay * 2, self.most)
        self.flaps = 0 if self.steady else self.flaps + 1
        return began, max(wait, min(self.most, self.first * 2 ** max(self.flaps - 1, 0)))

    def reached(self, now: float) -> float | None:
        """Lead answered: how long it was unreachable, or None if it was not."""
        down, self._down_since, self._delay = self._down_since, None, self.first
        return None if down is None else now - down

"""Bytes of tokens -> text, with stop strings that never leak.

UTF-8 characters split across tokens are held until complete (and left out if the
reply ends inside one); text that could still turn out to be the start of a stop
string is held until it cannot.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class TextStream:
    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = [s for s in stop if s]
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the reply

    def push(self, data: bytes) -> str:
        """Feed one token's bytes; return the text that is now safe to emit."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(data)
        found = self._first_stop()
        if found is not None:  # what it holds from there on is never released
            cut, self.matched = found
            self.stopped = True
        else:
            cut = len(self._held) - self._partial_stop_len()
        out, self._held = self._held[:cut], self._held[cut:]
        return out

    def finish(self) -> str:
        """End of generation: release what was held (no stop string completed). The bytes
        of a character the reply was cut inside are left out, as llama.cpp's server does,
        rather than ending the reply with U+FFFD."""
        if self.stopped:
            return ""
        out, self._held = self._held, ""
        self._decoder.reset()
        return out

    def _first_stop(self) -> tuple[int, str] | None:
        """Where the first stop string in the held text begins, and which it is."""
        hits = [(i, s) for i, s in ((self._held.find(s), s) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _partial_stop_len(self) -> int:
        """Length of the longest tail of held text that begins some stop string."""
        best = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best

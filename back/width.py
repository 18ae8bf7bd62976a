"""How many branches the back grows beside its draft, priced from what it measures (pure).

Each draft model call carries the draft's next guess and one more token of every branch,
so branches make each guess cost what a batch of 1 + width tokens costs. They are grown
where that costs the chain nothing it needs: where each branch adds at most PER_BRANCH of
a lone guess's price to a call, and all of them at most SLACK (a GPU, the simulation), or
where even at the wider price the back drafts as far ahead as it holds in a fraction
MARGIN of lead's step (a draft far faster than the target). On a CPU core a batch of 2
costs 1.3x one token and lead's step leaves no such room: the back drafts the chain alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.bounded import ewma

EWMA = 0.2  # weight of a new measurement
MARGIN = 0.8  # the share of lead's step the guesses may take: room for HTTP and noise
PER_BRANCH = 0.1  # a branch adding this share of a lone guess's price to a call is cheap
SLACK = 0.25  # ... and so are all of them, adding this much together
STALE_S = 5.0  # a gap this long between lead's steps is idleness, not a step
FORGET_CALLS = 200  # a batch size not measured in this many calls is measured afresh


@dataclass
class DraftPrices:
    """Seconds per draft model call, by tokens evaluated in it. A size not measured for
    FORGET_CALLS calls is forgotten: one slow call (a busy machine) would otherwise keep
    the back from ever trying that width again, and so from measuring it cheaper."""

    seconds: dict[int, float] = field(default_factory=dict)
    # note()'s own bookkeeping, never passed in: a size set without it would never be forgotten
    calls: int = field(default=0, init=False, repr=False)
    noted_at: dict[int, int] = field(default_factory=dict, init=False, repr=False)  # size -> call
    # The line fitted to `seconds` (slope, intercept), kept until the next note: asked for
    # several widths at every draft call, it changes only when a call is noted.
    _fit: tuple[float, float] | None = field(default=None, init=False, repr=False)

    def note(self, tokens: int, seconds: float) -> None:
        if tokens <= 0:
            return
        self._fit = None
        self.calls += 1
        self.seconds[tokens] = ewma(self.seconds.get(tokens), seconds, EWMA)
        self.noted_at[tokens] = self.calls
        for size in [s for s, at in self.noted_at.items() if self.calls - at >= FORGET_CALLS]:
            del self.seconds[size], self.noted_at[size]

    def of(self, tokens: int) -> float | None:
        """The price of a batch of `tokens` no larger than the largest measured: on the
        line fitted to every measured size (one size's noise would make the width
        flicker); None if none was measured."""
        if not self.seconds or tokens > max(self.seconds):
            return None
        if len(self.seconds) == 1:
            return self.seconds.get(tokens)
        if self._fit is None:
            self._fit = least_squares(self.seconds)
        slope, base = self._fit
        return base + slope * tokens


def least_squares(points: dict[int, float]) -> tuple[float, float]:
    """(slope, intercept) of the line fitted to two or more points x -> y. Plain Python:
    numpy's polyfit costs ~0.1 ms."""
    n = len(points)
    mean_x, mean_y = sum(points) / n, sum(points.values()) / n
    var = sum((x - mean_x) ** 2 for x in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points.items()) / var
    return slope, mean_y - slope * mean_x


@dataclass
class StepClock:
    """Lead's steps as the back sees them: seconds between states that add tokens."""

    step_s: float | None = None
    _last: tuple[int, float] | None = None  # (lead's tokens, when) at the last state
    _skip: bool = True  # the session's first gap: it may hold the prompt's evaluation
    _ends: float | None = None  # when lead said its step under way ends

    def note(self, n_tokens: int, now: float, left: float | None = None) -> None:
        """A state of lead's, taken at `now`; `left`: the seconds lead said were left of
        the step it was taking (a lead that does not say: None)."""
        if self._last is not None and n_tokens > self._last[0]:
            gap, skip, self._skip = now - self._last[1], self._skip, False
            if gap < STALE_S and not skip:
                self.step_s = ewma(self.step_s, gap, EWMA)
        if self._last is None or n_tokens != self._last[0]:
            self._last = (n_tokens, now)
            self._ends = None
        if left is not None:
            self._ends = now + left

    def ends_at(self) -> float | None:
        """When lead's step under way is expected to end (None: no step measured yet):
        when lead said it would, else a step (as measured) after the news of the last one.
        Lead's word counts most: a step verifying no draft ends sooner than the average."""
        if self._ends is not None:
            return self._ends
        if self.step_s is None or self._last is None:
            return None
        return self._last[1] + self.step_s


def choose_width(prices: DraftPrices, step_s: float | None, ahead: int, most: int) -> int:
    """The most branches (up to `most`) the rule above allows, the chain holding `ahead`
    guesses. A batch larger than any measured is tried once, if every narrower one fits."""
    lone = prices.of(1)
    if step_s is None or lone is None or most <= 0:
        return 0
    width = 0
    for w in range(1, most + 1):
        cost = prices.of(1 + w)
        if cost is None:
            return w  # (every narrower width fits)
        cheap = cost <= lone * (1 + min(SLACK, PER_BRANCH * w))
        if not (cheap or cost * max(ahead, 1) <= MARGIN * step_s):
            break
        width = w
    return width

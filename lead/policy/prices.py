"""What a step costs lead, by batch size: priced at startup, then measured as lead serves.

Reasoning and measurements: docs/cost-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.bounded import ewma

EWMA = 0.2  # weight of a new measurement
PAD_SAVING = 0.97  # pad to a larger batch only where that is 3 % cheaper (less is noise)


@dataclass
class Prices:
    """Seconds per step of b tokens: quiet (no back drafting) `plain_s * shape[b]`, and
    that times `slowdown` while a back drafts (the two share memory and caches)."""

    cost_s: dict[int, float] = field(default_factory=dict)  # EWMA per b, as measured
    shape: dict[int, float] = field(default_factory=lambda: {1: 1.0})  # quiet cost(b)/cost(1)
    plain_s: float | None = None  # a one-token step with no back drafting
    slowdown: float = 1.0  # a step while a back drafts over its quiet price
    fixed: bool = False  # shape given (--verify-cost): steps update only plain_s

    def fix(self, relative: list[float], up_to: int) -> None:
        """Take `relative` as the quiet cost of 2, 3, ... tokens over one, for good; sizes
        past it, up to `up_to`, continue its last step (a list of one: the same cost)."""
        step = relative[-1] - relative[-2] if len(relative) > 1 else 0.0
        costs = [*relative, *(relative[-1] + step * (i + 1)
                              for i in range(max(0, up_to - 1 - len(relative))))]
        self.shape = {1: 1.0, **{b: max(c, 1e-3) for b, c in enumerate(costs, start=2)}}
        self.fixed = True

    def calibrate(self, seconds: dict[int, float]) -> None:
        """Quiet seconds per batch size, measured before serving (must include b=1). No
        batch costs less than one token: where one looked dearer than a larger batch, the
        machine was busy while it was timed, and the fastest size prices one token."""
        one = min(seconds.values())
        self.shape = {b: s / one for b, s in sorted(seconds.items())}
        self.shape[1] = 1.0
        if self.plain_s is None:
            self.plain_s = one

    def record(self, batch_size: int, seconds: float, busy: bool = False) -> None:
        """A step of `batch_size` tokens took `seconds`; `busy`: while a back drafted."""
        self.cost_s[batch_size] = ewma(self.cost_s.get(batch_size), seconds, EWMA)
        if self.fixed and (batch_size != 1 or busy):
            return  # the shape and slowdown are what the user gave
        if batch_size == 1 and not busy:
            self.plain_s = ewma(self.plain_s, seconds, EWMA)
        elif self.plain_s is None or batch_size not in self.shape:
            self._first_price(batch_size, seconds)
        else:
            quiet = self.plain_s * self.shape[batch_size]
            self.slowdown = ewma(self.slowdown, seconds / quiet, EWMA)

    def _first_price(self, batch_size: int, seconds: float) -> None:
        """A size's first price sets its shape, with plain and slowdown as they stand."""
        if self.plain_s is None:
            self.plain_s = seconds / (self.slowdown * self.shape_of(batch_size))
        self.shape[batch_size] = seconds / (self.slowdown * self.plain_s)

    @property
    def largest(self) -> int:
        return max(self.shape)

    def shape_of(self, batch_size: int) -> float:
        """Quiet cost of `batch_size` tokens over one; an unpriced size between two priced
        ones costs what the line between them says (large batches are priced a few sizes
        apart), one past them all what the largest costs, so that it gets tried."""
        if batch_size in self.shape:
            return self.shape[batch_size]
        below = max(b for b in self.shape if b < batch_size)
        above = min((b for b in self.shape if b > batch_size), default=None)
        if above is None:
            return self.shape[below]
        share = (batch_size - below) / (above - below)
        return self.shape[below] + share * (self.shape[above] - self.shape[below])

    def batch_for(self, batch_size: int) -> int:
        """The batch to evaluate for `batch_size` tokens: a larger priced one where the
        kernels make it cheaper, padded with tokens whose rows are ignored."""
        own = self.shape_of(batch_size)
        cheaper = [b for b in self.shape if b > batch_size and self.shape[b] < PAD_SAVING * own]
        return min(cheaper, key=lambda b: (self.shape[b], b)) if cheaper else batch_size

    def relative(self, batch_size: int) -> float:
        """Quiet cost of evaluating `batch_size` tokens (padded where cheaper) over one."""
        return self.shape_of(self.batch_for(batch_size))

    def within(self, steps: float) -> int:
        """The most tokens one batch evaluates for at most `steps` one-token steps' price
        (past the largest priced size, at that size's price per token)."""
        fits = [b for b, x in self.shape.items() if x <= steps]
        largest = max(fits, default=1)
        if largest < self.largest:
            return largest
        return max(largest, int(largest * steps / self.shape[largest]))

    def plain(self) -> float:
        """Seconds per token of plain decoding (no back drafting); 1.0 before any price."""
        return self.plain_s if self.plain_s is not None else 1.0

    def busy_s(self, batch_size: int) -> float:
        """Seconds a step of `batch_size` tokens takes while a back drafts."""
        return self.plain() * self.relative(batch_size) * self.slowdown

    def ceiling(self) -> tuple[float, int]:
        """(how many times plain decoding's rate verifying reaches were every draft token
        right, the batch size that reaches it): what no drafter can beat here."""
        best = max(self.shape, key=lambda b: (b / self.shape[b], -b))
        return best / self.shape[best], best

    def describe(self) -> str:
        """One line on the priced batch sizes and what they allow at most."""
        sizes = ", ".join(f"b={b} {x:.2f}x" for b, x in sorted(self.shape.items()) if b > 1)
        most, b = self.ceiling()
        return (f"verify cost over one token ({self.plain() * 1000:.1f} ms): {sizes}; drafts "
                f"right every time would decode at most {most:.2f}x as fast (b={b})")

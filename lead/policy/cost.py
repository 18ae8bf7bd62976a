"""Cost-aware draft length: `CostModel` verifies the draft length k that maximises expected
tokens per second, and asks backs for drafts only when that pays or a probe is open, over
`Prices`, the scoreboard (each drafter's acceptance, learned from drafts on offer:
lead/policy/scoreboard.py; backs' drafts are priced by the best back's record) and
`ProbeSchedule`. Formulas, defaults and the measurements behind them: docs/cost-model.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from lead.policy.acceptance import accepted_curve
from lead.policy.prices import Prices
from lead.policy.probes import AfterProbe, ProbeSchedule
from lead.policy.scoreboard import Scoreboard
from shared.wire.protocol import Stop


@dataclass
class CostModel:
    """The draft length to verify (`verify_len`) and to ask backs for (`draft_len`), and whether
    backs should do no work at all (`hush`)."""

    max_draft: int
    fixed: int | None = None  # a user-forced draft length bypasses the model
    margin: float = 1.1  # speculate only for an expected gain of 10 % or more
    hush_at: float = 1.1  # a back slowing lead this much, past what drafts could repay, is hushed
    prices: Prices = field(default_factory=Prices)
    probes: ProbeSchedule = field(default_factory=ProbeSchedule)
    longest: int = 0  # most tokens of lead's own drafts (0: it makes none)
    scores: Scoreboard = field(init=False)  # every drafter's record: the one scoreboard

    def __post_init__(self) -> None:
        self.scores = Scoreboard(heard=self._heard)

    # --- measurements in ---

    def fix_prices(self, relative: list[float]) -> None:
        """Verify costs given, not measured (--verify-cost): `relative[i]` is a batch of
        i + 2 tokens over one token's; priced up to two drafts' worth."""
        self.prices.fix(relative, max(2 * self.max_draft, self.longest) + 1)

    def record_step(self, batch_size: int, seconds: float, busy: bool = False,
                    priced: bool = True) -> None:
        """A step of `batch_size` tokens took `seconds`; `busy`: while a back drafted
        (a verify step always is); `priced`: a step the prices learn from."""
        if priced:
            self.prices.record(batch_size, seconds, busy)
        self._schedule_probe()

    def _heard(self) -> None:
        """A back's draft was compared with what lead emitted (on the scoreboard)."""
        if self.probes.probing and self.probes.outcome():
            self.probes.end(self._after_probe())

    def _schedule_probe(self) -> None:
        probes = self.probes
        if probes.probing:
            if probes.probe_step():
                probes.end(self._after_probe())  # no back offered a draft: it has nothing to say
        elif self.verify_len() > 0:
            probes.speculating()
        elif probes.quiet_step() and self.could_pay(1.0):
            if self._too_slow():  # measure the back's slowdown afresh: it may have moved or gone
                self.prices.slowdown = 1.0
            probes.start()

    def _after_probe(self) -> AfterProbe:
        if self._too_slow():
            return AfterProbe.HUSHED
        if not self.could_pay(self.prices.slowdown):
            return AfterProbe.PRICED_OUT  # only a change of slowdown would help
        return AfterProbe.NOTHING_PAYS if self.verify_len() == 0 else AfterProbe.PAYS

    # --- decisions out ---

    def could_pay(self, slowdown: float) -> bool:
        """Whether some draft length would pay if every draft token were right."""
        return any((k + 1) / (self.prices.relative(k + 1) * slowdown) >= self.margin
                   for k in range(1, self.max_draft + 1))

    def verify_len(self, available: int | None = None, first: bool = False) -> int:
        """The draft length to verify, at most `available` (None: no limit but max_draft);
        `first`: for a reply's first step."""
        upper = self.max_draft if available is None else min(available, self.max_draft)
        if self.fixed is not None:
            return min(self.fixed, upper)
        upper = min(upper, self.prices.largest)  # at most one size past the priced
        if upper < 1:
            return 0
        # tokens per second verifying k draft tokens (k=0: plain decoding, back quiet); alpha
        # read once, as this runs at every step
        expected = [1.0 + y for y in accepted_curve(self.scores.leader.p_accept(upper, first))]
        seconds = [self.prices.plain(), *(self.prices.busy_s(k + 1) for k in range(1, upper + 1))]
        rates = [e / max(s, 1e-9) for e, s in zip(expected, seconds, strict=True)]
        best = max(range(1, upper + 1), key=rates.__getitem__)
        return best if rates[best] >= self.margin * rates[0] else 0

    def allocate(self, p_accept: Sequence[Sequence[float]], base: int | None = None) -> list[int]:
        """Draft tokens to verify per session in one batch, session i's tokens accepted with
        p_accept[i] (each given the ones before it; at most what it offers), maximising the
        geometric mean of the sessions' rates (expected tokens over the batch's price): one
        session's long draft makes every session's step dearer, so it is verified only where
        it raises its own rate more than it lowers the others'. The fewest tokens within 1 %
        of the best; none where that beats plain decoding by less than `margin`. `base`:
        tokens the batch holds besides drafts (one per session, and any prompt)."""
        if self.fixed is not None:
            return [min(self.fixed, len(o)) for o in p_accept]
        base = len(p_accept) if base is None else base
        picks, scores = self._greedy(p_accept, base, max(0, self.prices.largest - base))
        best = max(scores)
        t = next(t for t, score in enumerate(scores) if score >= best + math.log(0.99))
        if scores[t] < scores[0] + math.log(self.margin):
            t = 0
        return [picks[:t].count(i) for i in range(len(p_accept))]

    def _greedy(self, p_accept: Sequence[Sequence[float]], base: int, most: int
                ) -> tuple[list[int], list[float]]:
        """Draft tokens added one at a time, each to the session whose expected tokens it
        raises by the largest factor (`picks`: whose), and after each the mean log of the
        sessions' rates (scores[0]: no drafts, quiet)."""
        n = max(len(p_accept), 1)
        reach, expected, taken = [1.0] * len(p_accept), [1.0] * len(p_accept), [0] * len(p_accept)
        plain = max(self.prices.plain() * self.prices.relative(base), 1e-9)
        scores = [-math.log(plain)]
        picks: list[int] = []
        while len(picks) < most:
            open_ = [i for i in range(len(p_accept)) if taken[i] < len(p_accept[i])]
            if not open_:
                break
            i = max(open_, key=lambda j: reach[j] * p_accept[j][taken[j]] / expected[j])
            reach[i] *= p_accept[i][taken[i]]
            taken[i] += 1
            expected[i] += reach[i]
            picks.append(i)
            price = max(self.prices.busy_s(base + len(picks)), 1e-9)
            scores.append(sum(math.log(e) for e in expected) / n - math.log(price))
        return picks, scores

    def draft_len(self, first: bool = False) -> int:
        """Draft length to ask backs for: what pays, else 1 during a probe or, while
        speculation is on, before a reply's first step (to keep learning alpha_first),
        else 0; 0 while backs are hushed."""
        if self.hush:
            return 0  # backs slow lead more than drafts could repay
        best = self.verify_len(first=first)
        if best > 0 or self.fixed is not None or not self.could_pay(1.0):  # (max_draft 0: cannot)
            return best
        return 1 if self.probes.probing or (first and self.verify_len() > 0) else 0

    def asked(self, first: bool = False) -> tuple[int, str | None]:
        """What backs are asked for now: `draft_len` tokens, and where that is 0, why
        (shared/wire/protocol.py's Stop; None where they are asked for drafts)."""
        n = self.draft_len(first)
        return n, None if n else Stop.SLOWED if self.hush else Stop.UNPAID

    @property
    def hush(self) -> bool:
        """Whether backs should do no work at all, not even catch up: the last probe found
        a working back too slow. Lifted by the next probe, which measures again."""
        return not self.probes.probing and self._too_slow()

    def _too_slow(self) -> bool:
        """A working back slows lead's steps by `hush_at` or more, so much that not even
        perfect drafts could pay for it."""
        slowdown = self.prices.slowdown
        return self.fixed is None and slowdown >= self.hush_at and not self.could_pay(slowdown)

    # --- views ---

    def describe(self) -> str:
        """One line on the priced batch sizes and what they allow."""
        line = self.prices.describe()
        if self.could_pay(1.0):
            return line
        return (f"{line}; not even perfect drafts would pay {self.margin:.1f}x here, so backs "
                "will not be asked for drafts (--draft-len N forces a length)")

    @property
    def alpha(self) -> float:
        """What the best back heard lately gets right, mid-reply."""
        return self.scores.leader.alpha

    def snapshot(self) -> dict[str, float]:
        return {"slowdown": self.prices.slowdown, "hush": float(self.hush),
                "alpha": self.alpha, "alpha_first": self.scores.leader.first.value}

"""Cost-aware draft length, measured online.

cost(b): seconds to evaluate a batch of b tokens (EWMA per b).
alpha:   probability that a draft token is right given its predecessors were. A draft
         on offer is compared with the tokens lead emits, whether lead verified it or
         not ("shadow" outcomes, free for lead), and followed over the next steps until
         a miss or 8 matches (`OfferWatch`): a plain step emits one token, and scoring
         each offer on it alone capped alpha from probes near 0.92. The estimate is the
         censored geometric MLE, matches / (matches + misses), with both counts decayed
         per outcome, plus a weak prior; lead uses the lower of that and the same estimate
         over the last 3 outcomes alone, so that it follows a drop within a step or two
         (a code step brings 8 matches, a prose step 1 match and 1 miss: decayed counts
         alone took 10 prose steps to fall from 0.96 to 0.7).
         (Estimating it from verified steps alone, as a first version did, starved it:
         once speculation was off, only sparse k=1 probes fed it, and it read 0.61 where
         teacher-forced acceptance was 0.85-0.92. A window of the last 64 draft positions
         came next: a code reply's long runs of matches outweighed the misses of the
         explanation that followed for most of its 64 tokens, and duo fell to 0.78x.)
A step verifying k draft tokens yields on average (1 - alpha^(k+1)) / (1 - alpha)
tokens and costs cost(k+1); lead verifies the k that maximises tokens per second
(0: plain decode), and only if it beats plain decoding by `margin`: where the gain
would be marginal (prose on a CPU, alpha ~0.6, b=2 costing 1.8x), the estimates'
noise made lead switch speculation on and off and lose up to 10 %.

Prices: lead evaluates batches of 1..max_draft+1 tokens at startup (`calibrate`), so
the shape of cost over b is known before any draft arrives: exploring one size at a
time, each priced as the last one measured, cost 4-11 % of a benchmark's first round on
two CPUs (on one, b=4 costs 1.5x a token but b=3 2x), and one slow first step at b=2
(6.5x a token) priced it out for the life of a process. Without calibration (fakes in
tests) sizes are still explored one at a time, an unmeasured size costing what the
largest measured one does. A drafting back slows lead (the two share memory and
caches): one-token steps cost 85-93 ms while it drafted, 48 ms while it was quiet, on
one machine. So plain decoding is priced from quiet steps only, and a speculating step
at its quiet price times `slowdown`, the ratio of busy steps to their quiet prices,
which every probe measures again (a single outlier cannot stick). Where even perfect
drafts could not pay at quiet prices, lead never asks for drafts at all.

While no draft length pays, lead asks backs for drafts only in probes (a back is
otherwise not woken per token). A probe lasts until `probe_outcomes` drafts have been
compared with what lead emitted, or for at most `probe_steps` steps (a back with
nothing to offer, an n-gram drafter on prose, would otherwise keep it open and be
woken per token). Probe drafts are compared, not verified, so a probe costs lead
nothing but the requests (and the back's work: a draft model busy on the other core
slowed lead by 8 % here). The first probe comes `probe_first` steps after speculation
stops, and the gap doubles up to `probe_every` while probes find nothing that pays: a
chat reply's first token often differs from the draft's, and that one miss, followed
by a fixed 32 quiet steps, left half of a 64-token code reply undrafted. (A probe of
a fixed 4 steps was too short: a back woken from quiet must first catch up, and the
estimate never recovered.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

EWMA = 0.2


def _ewma(old: float, new: float) -> float:
    return old + EWMA * (new - old)


def draft_outcome(draft_ids: Sequence[int], emitted: Sequence[int]) -> tuple[int, bool]:
    """(matches, missed): how many leading draft tokens lead then emitted, and whether a
    draft token was contradicted (False: the draft or the emitted tokens ran out first)."""
    for i, (guess, token) in enumerate(zip(draft_ids, emitted, strict=False)):
        if guess != token:
            return i, True
    return min(len(draft_ids), len(emitted)), False


@dataclass(frozen=True)
class OfferWatch:
    """A draft on offer at position `start`, compared with lead's tokens as they come, over
    as many steps as that takes. (Compared with one step's emission alone, a plain step
    shows at most one token of a draft: probes could not lift alpha past ~0.92, so after
    a prose reply the code replies that followed went undrafted.)"""

    start: int
    token_ids: tuple[int, ...]
    first: bool  # offered at a reply's first step
    limit: int = 8  # the most draft tokens one outcome covers

    def extended(self, tokens: Sequence[int], draft_ids: Sequence[int]) -> OfferWatch:
        """This watch, or, if a later offer continues its draft, that draft reaching
        further. (A back woken for a probe posts its draft a token at a time: watching
        the first post alone saw one token of it.)"""
        seen = tuple(self._since(tokens))  # lead's tokens since, all agreeing
        rest = tuple(self.token_ids[len(seen):])
        if len(seen) <= len(self.token_ids) and len(draft_ids) > len(rest) \
                and tuple(draft_ids[:len(rest)]) == rest:
            return replace(self, token_ids=(seen + tuple(draft_ids))[:self.limit])
        return self

    def used_up(self, tokens: Sequence[int]) -> bool:
        return len(tokens) - self.start >= len(self.token_ids)

    def result(self, tokens: Sequence[int]) -> tuple[int, bool]:
        """(matches, missed) so far."""
        return draft_outcome(self.token_ids, self._since(tokens))

    def _since(self, tokens: Sequence[int]) -> Sequence[int]:
        # at most one past the draft: a watch can stay open for a whole reply
        return tokens[self.start:self.start + len(self.token_ids) + 1]

    def outcome(self, tokens: Sequence[int], final: bool = False) -> tuple[int, bool] | None:
        """The result once `tokens` settle the draft: a miss, `limit` matches, or `final`
        (the reply ended); else None."""
        matches, missed = self.result(tokens)
        return (matches, missed) if final or missed or matches >= self.limit else None


@dataclass
class CostModel:
    max_draft: int
    fixed: int | None = None  # a user-forced draft length bypasses the model
    prior: tuple[float, float] = (1.6, 0.4)  # pseudo (matches, misses): alpha 0.8, weight 2
    decay: float = 0.8  # per observed step: the last ~5 steps carry most of the weight
    probe_first: int = 8
    probe_every: int = 32  # the longest gap between probes
    probe_outcomes: int = 4
    probe_steps: int = 16  # a probe ends after this many steps even without its outcomes
    margin: float = 1.1  # speculate only for an expected gain of 10 % or more
    hush_at: float = 1.1  # a back slowing lead this much, past what drafts could repay, is hushed
    hush_every: int = 512  # the longest gap between probes while hushed
    cost_s: dict[int, float] = field(default_factory=dict)  # as measured (reported)
    shape: dict[int, float] = field(default_factory=lambda: {1: 1.0})  # quiet cost(b)/cost(1)
    plain_s: float | None = None  # a one-token step with no back drafting
    slowdown: float = 1.0  # a step while a back drafts over its quiet price
    matches: float = 0.0
    misses: float = 0.0
    recent: deque[tuple[int, bool]] = field(default_factory=lambda: deque(maxlen=3))
    probing: int = 0  # outcomes the current probe still wants
    probe_age: int = 0  # steps the current probe has been open
    since_probe: int = 0  # steps since the last probe ended, or speculation stopped
    probe_gap: int = 0  # quiet steps before the next probe
    first_prior: tuple[float, float] = (1.0, 1.0)
    first_matches: float = 0.0  # decayed, per reply: was the draft's first token right
    first_misses: float = 0.0

    def __post_init__(self) -> None:
        self.probe_gap = self.probe_first

    @property
    def alpha(self) -> float:
        recent_matches = sum(m for m, _ in self.recent)
        recent_misses = sum(int(missed) for _, missed in self.recent)
        return min(self._mle(self.matches, self.misses), self._mle(recent_matches, recent_misses))

    @property
    def alpha_first(self) -> float:
        """Probability that a draft's guess of a reply's first token is right."""
        matches = self.first_prior[0] + self.first_matches
        return matches / (matches + self.first_prior[1] + self.first_misses)

    def _mle(self, matches: float, misses: float) -> float:
        matches, misses = self.prior[0] + matches, self.prior[1] + misses
        return matches / (matches + misses)

    def calibrate(self, seconds: dict[int, float]) -> None:
        """Quiet seconds per batch size, measured before serving."""
        self.shape = {b: s / seconds[1] for b, s in sorted(seconds.items())}
        if self.plain_s is None:
            self.plain_s = seconds[1]

    def record_step(self, batch_size: int, seconds: float, busy: bool = False) -> None:
        """A step of `batch_size` tokens took `seconds`; `busy`: while a back drafted
        (a verify step always is)."""
        old = self.cost_s.get(batch_size)
        self.cost_s[batch_size] = seconds if old is None else _ewma(old, seconds)
        if batch_size == 1 and not busy:
            self.plain_s = seconds if self.plain_s is None else _ewma(self.plain_s, seconds)
        elif self.plain_s is None or batch_size not in self.shape:
            # a size's first price sets its shape, with plain and slowdown as they stand
            if self.plain_s is None:
                self.plain_s = seconds / (self.slowdown * self._shape(batch_size))
            self.shape[batch_size] = seconds / (self.slowdown * self.plain_s)
        else:
            quiet = self.plain_s * self.shape[batch_size]
            self.slowdown = _ewma(self.slowdown, seconds / quiet)
        self._schedule_probe()

    def _schedule_probe(self) -> None:
        if self.probing:
            self.probe_age += 1
            if self.probe_age >= self.probe_steps:
                self._end_probe()  # no back offered a draft: it has nothing to say
        elif self.choose() > 0:
            self.since_probe, self.probe_gap = 0, self.probe_first  # speculating
        else:
            self.since_probe += 1
            if self.since_probe >= self.probe_gap and self.could_pay(1.0):
                if self.hush:  # measure the back afresh: it may have moved or gone
                    self.slowdown = 1.0
                self.probing, self.probe_age = self.probe_outcomes, 0

    def record_outcome(self, matches: int, missed: bool, first: bool = False) -> None:
        """A draft compared with what lead emitted; `first`: at a reply's first step."""
        if matches == 0 and not missed:
            return  # nothing observed
        if first:
            hit = matches > 0
            self.first_matches = self.first_matches * self.decay + hit
            self.first_misses = self.first_misses * self.decay + (not hit)
            if not hit:
                return
            matches -= 1  # past its first token, a draft is like any other
            if matches == 0 and not missed:
                return
        self.matches = self.matches * self.decay + matches
        self.misses = self.misses * self.decay + int(missed)
        self.recent.append((matches, missed))
        if self.probing:
            self.probing -= 1
            if not self.probing:
                self._end_probe()

    def _end_probe(self) -> None:
        self.probing, self.since_probe = 0, 0
        if self.hush:  # the back costs lead more than it can give: ask ever more rarely
            self.probe_gap = min(max(2 * self.probe_gap, self.probe_every), self.hush_every)
        elif not self.could_pay(self.slowdown):  # only a change of slowdown would help
            self.probe_gap = self.probe_every
        elif self.choose() == 0:  # nothing pays yet: wait longer before the next probe
            self.probe_gap = min(2 * self.probe_gap, self.probe_every)

    @property
    def hush(self) -> bool:
        """Whether backs should do no work at all, not even catch up: the last probe found
        that a working back slows lead's steps by `hush_at` or more, so much that not even
        perfect drafts could pay for it. Lifted by the next probe, which measures again.
        (Hushing whenever drafts did not pay at the current estimate also silenced backs
        that were about to prove right, before they could.)"""
        return (self.fixed is None and not self.probing and self.slowdown >= self.hush_at
                and not self.could_pay(self.slowdown))

    def _shape(self, batch_size: int) -> float:
        if batch_size in self.shape:
            return self.shape[batch_size]
        return self.shape[max(b for b in self.shape if b < batch_size)]  # explores

    def batch_for(self, batch_size: int) -> int:
        """The batch to evaluate for `batch_size` tokens: a larger priced one where the
        kernels make it 3 % cheaper or more (on one CPU 4 tokens cost 1.5x one, 3 tokens
        2x), padded with tokens whose rows are ignored."""
        own = self._shape(batch_size)
        cheaper = [b for b in self.shape if b > batch_size and self.shape[b] < 0.97 * own]
        return min(cheaper, key=lambda b: (self.shape[b], b)) if cheaper else batch_size

    def plain(self) -> float:
        """Seconds per token of plain decoding (no back drafting)."""
        return self.plain_s if self.plain_s is not None else 1.0

    def cost(self, batch_size: int) -> float:
        """Seconds a step of `batch_size` tokens takes while a back drafts."""
        return self.plain() * self._shape(self.batch_for(batch_size)) * self.slowdown

    def could_pay(self, slowdown: float) -> bool:
        """Whether some draft length would pay if every draft token were right."""
        return any((k + 1) / (self._shape(self.batch_for(k + 1)) * slowdown) >= self.margin
                   for k in range(1, self.max_draft + 1))

    def expected_tokens(self, k: int, first: bool = False) -> float:
        """Tokens a step verifying k draft tokens emits: 1 + a1 (1 + a + ... + a^(k-1))."""
        a = min(self.alpha, 0.999)
        a1 = self.alpha_first if first else a
        return 1.0 + a1 * (1.0 - a ** k) / (1.0 - a)

    def rate(self, k: int, first: bool = False) -> float:
        """Tokens per second verifying k draft tokens (k=0: plain decoding, back quiet)."""
        seconds = self.plain() if k == 0 else self.cost(k + 1)
        return self.expected_tokens(k, first) / max(seconds, 1e-9)

    def choose(self, available: int | None = None, first: bool = False) -> int:
        """The draft length to verify, at most `available` (None: no limit but max_draft);
        `first`: for a reply's first step."""
        upper = self.max_draft if available is None else min(available, self.max_draft)
        if self.fixed is not None:
            return min(self.fixed, upper)
        upper = min(upper, max(self.shape))  # at most one size past the priced
        if upper < 1:
            return 0
        best = max(range(1, upper + 1), key=lambda k: self.rate(k, first))
        return best if self.rate(best, first) >= self.margin * self.rate(0) else 0

    def wanted(self, first: bool = False) -> int:
        """Draft length to ask backs for: what pays, else 1 during a probe or, while
        speculation is on, before a reply's first step (to keep learning alpha_first),
        else 0 (quiet). (Asked at every first step, a back beside lead took in each prompt
        on lead's CPU while speculation was off.)"""
        best = self.choose(first=first)
        if best > 0 or self.fixed is not None or self.max_draft == 0:
            return best
        if not self.could_pay(1.0) or self.hush:
            return 0  # not even perfect drafts would pay, or backs slow lead: they stay quiet
        return 1 if self.probing or (first and self.choose() > 0) else 0

    def describe(self) -> str:
        """One line on the priced batch sizes and what they allow."""
        sizes = ", ".join(f"b={b} {x:.2f}x" for b, x in sorted(self.shape.items()) if b > 1)
        line = f"verify cost over one token ({self.plain() * 1000:.1f} ms): {sizes}"
        if self.could_pay(1.0):
            return line
        return (f"{line}; not even perfect drafts would pay {self.margin:.1f}x here, so backs "
                "will not be asked for drafts (--draft-len N forces a length)")

    def snapshot(self) -> dict[str, float]:
        out = {f"cost_b{b}": s for b, s in sorted(self.cost_s.items())}
        out["slowdown"] = self.slowdown
        out["hush"] = float(self.hush)
        out["alpha"] = self.alpha
        out["alpha_first"] = self.alpha_first
        return out

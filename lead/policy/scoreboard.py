"""The one scoreboard: what every drafter offered at a step, compared with what lead then
emitted, kept as one record per drafter (each back by the board's key for it, each of
lead's own kinds by name). The board ranks drafts by these records and the cost model
prices drafts by them: one estimate of each drafter, learned in one place (`settle`).

Every drafter's offer is watched, verified or not, so a drafter is measured while lead
decodes plainly, and a good back that joins late wins without lead first verifying its
drafts. A watch follows a draft that later offers continue (a back posts its draft a
token at a time) until lead's tokens settle it: a miss, `limit` matches, or the reply's
end; so a whole draft counts as one outcome, however many steps lead took to emit it.

Where a drafter says what it knows of each token (a back its draft model's q, a copy the
length of the match it follows), the acceptance probabilities are learned per band of that knowledge
(`Scale`): one that claims q = 1 for junk teaches lead what its 1 is worth.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property

from lead.policy.acceptance import MAX_ALPHA, Bands, Rate, agreement, draft_outcome
from shared.bounded import Lru

# Pseudo (matches, misses) of a drafter not yet seen: 0.8 with the weight of two outcomes,
# so a new back is tried at once and one miss at its first token puts it below a good one.
PRIOR = (1.6, 0.4)
FIRST_PRIOR = (1.0, 1.0)  # its guess of a reply's first token: 0.5, weight 2
DECAY = 0.9  # per outcome: about the last ten carry the estimate
RECENT = 3  # outcomes in the recent estimate: a drafter turning bad loses within a few
KEPT = 256  # drafters whose record is kept (least recently updated dropped first)
WEIGHT = 4.0  # outcomes a band's prior counts as
LIMIT = 8  # the most draft tokens one outcome covers: a good drafter is heard every few steps
RECENT_BACKS = 4  # backs heard lately, the best of which the cost model prices drafts by


@dataclass(frozen=True)
class Scale:
    """Bands of what a drafter knows of a token (each band's lower end), each with the
    acceptance probability it starts from, worth WEIGHT outcomes (None: its drafter's own
    acceptance, so where the knowledge says nothing every band stays near it); `decay` per
    outcome."""

    name: str
    priors: tuple[tuple[float, float | None], ...]
    decay: float

    def bands(self) -> Bands:
        return Bands({low: Rate((0.0, 0.0), self.decay) if p is None else
                      Rate((0.0, 0.0), self.decay, right=p * WEIGHT, wrong=(1 - p) * WEIGHT)
                      for low, p in self.priors})

    def p_band(self, bands: Bands, band: float, alpha: float) -> float:
        """The acceptance probability of a token in band `band`."""
        prior = self.prior_of[band]
        over = (WEIGHT * alpha, WEIGHT * (1 - alpha)) if prior is None else (0.0, 0.0)
        return bands.rates[band].given(over)

    @cached_property
    def prior_of(self) -> dict[float, float | None]:
        return dict(self.priors)


@dataclass(frozen=True)
class Offer:
    """What a drafter offers past lead's tokens: its tail, and per token what it knows of
    it (on `scale`); `back`: a back's (the cost model prices backs' drafts by them)."""

    tail: tuple[int, ...]
    known: tuple[float, ...] | None = None
    scale: Scale | None = None
    back: bool = True


@dataclass
class Record:
    """One drafter's record: how often its draft tokens are right given the ones before
    (`rest`), its guess of a reply's first token apart (`first`), and its bands."""

    rest: Rate = field(default_factory=lambda: Rate(PRIOR, DECAY, RECENT))
    first: Rate = field(default_factory=lambda: Rate(FIRST_PRIOR, DECAY))
    bands: dict[str, Bands] = field(default_factory=dict)

    @property
    def alpha(self) -> float:
        return self.rest.value

    @property
    def measured(self) -> bool:
        return self.rest.right + self.rest.wrong > 0

    def record(self, matches: int, missed: bool, first: bool = False) -> bool:
        """Its draft matched lead's next `matches` tokens, then `missed` (False: it or
        lead's tokens ran out); `first`: from a reply's first token. True where the
        outcome moved alpha (a miss at a reply's first token moves only `first`)."""
        if first and (matches or missed):
            self.first.record(matches > 0, matches == 0)
            if matches == 0:
                return False
            matches -= 1  # past its first token, a draft is like any other
        if matches == 0 and not missed:
            return False  # nothing observed
        self.rest.record(matches, int(missed))
        return True

    def p_accept(self, n: int, first: bool = False) -> list[float]:
        """Acceptance probabilities of a draft of n tokens known only by its drafter's
        acceptance: each right with alpha given the ones before it (its first, at a reply's
        first step, with the first-token estimate)."""
        a = min(self.alpha, MAX_ALPHA)
        return [self.first.value if first else a, *[a] * (n - 1)][:n]


@dataclass(frozen=True)
class Watch:
    """An offer at position `start`, compared with lead's tokens as they come."""

    start: int
    offer: Offer
    first: bool  # offered at a reply's first step
    limit: int = LIMIT

    def extended(self, tokens: Sequence[int], offer: Offer) -> Watch:
        """This watch, or, where `offer` continues its draft past the tokens lead emitted
        since, that draft reaching further."""
        seen = tuple(tokens[self.start:self.start + len(self.offer.tail) + 1])
        tail, rest = self.offer.tail, self.offer.tail[len(seen):]
        if len(seen) > len(tail) or seen != tail[:len(seen)] \
                or len(offer.tail) <= len(rest) or offer.tail[:len(rest)] != rest \
                or offer.scale != self.offer.scale:
            return self
        known = None if self.offer.known is None or offer.known is None else \
            (*self.offer.known[:len(seen)], *offer.known)[:self.limit]
        return replace(self, offer=replace(self.offer, tail=(*seen, *offer.tail)[:self.limit],
                                           known=known))

    def used_up(self, tokens: Sequence[int]) -> bool:
        return len(tokens) - self.start >= len(self.offer.tail)


class Scoreboard:
    """Each drafter's record (`records`, by key) and the offers of each running session
    watched until lead's tokens settle them. `heard` is called when a back's outcome moves
    its acceptance (the cost model's probes end on it)."""

    def __init__(self, heard: Callable[[], None] = lambda: None, kept: int = KEPT) -> None:
        self.heard = heard
        self.records: Lru[str, Record] = Lru(kept)
        self.watches: dict[str, dict[str, Watch]] = {}  # per session, per drafter
        self.backs: Lru[str, None] = Lru(RECENT_BACKS)  # backs heard lately, newest last

    def record_of(self, key: str) -> Record:
        return self.records.get(key) or Record()

    def alpha(self, key: str) -> float:
        return self.record_of(key).alpha

    def known_p_accept(self, key: str, known: Sequence[float], scale: Scale) -> tuple[float, ...]:
        """Per token of a draft whose drafter knows `known` of its tokens on `scale`: the
        probability that lead accepts it, given the ones before it."""
        record = self.record_of(key)
        bands, alpha = record.bands.get(scale.name) or scale.bands(), record.alpha
        per_band: dict[float, float] = {}  # a draft's tokens fall in a few bands
        out = []
        for k in known:
            band = bands.band(k)
            p = per_band.get(band)
            if p is None:
                p = per_band[band] = scale.p_band(bands, band, alpha)
            out.append(p)
        return tuple(out)

    @property
    def leader(self) -> Record:
        """The record of the best of the backs heard lately (a fresh one before any)."""
        heard = [self.records[k] for k in self.backs if k in self.records]
        return max(heard, key=lambda r: r.alpha, default=Record())

    def offered(self, session_id: str, tokens: Sequence[int], first: bool,
                offers: Mapping[str, Offer]) -> None:
        """What each drafter offers at the step that is about to extend `tokens`: a
        watched draft it continues, or one still open, goes on being watched; else the
        watched one is settled and this one watched."""
        watches = self.watches.setdefault(session_id, {})
        for key, offer in offers.items():
            watch = watches.get(key)
            if watch is not None:
                longer = watch.extended(tokens, offer)
                if longer is not watch or not watch.used_up(tokens):
                    watches[key] = longer
                    continue
                self._settle(key, watch, tokens, final=True)
            watches[key] = Watch(len(tokens), offer, first)

    def settle(self, session_id: str, tokens: Sequence[int], final: bool = False) -> None:
        """The step's settle: every watched offer of the session that `tokens` settle (a
        miss, its limit, or `final`: the reply ended) is recorded and no longer watched."""
        watches = self.watches.get(session_id, {})
        for key, watch in list(watches.items()):
            if self._settle(key, watch, tokens, final):
                del watches[key]
        if final:
            self.watches.pop(session_id, None)

    def _settle(self, key: str, watch: Watch, tokens: Sequence[int], final: bool) -> bool:
        """The one comparison of an offer with what lead emitted: recorded where settled."""
        offer = watch.offer
        emitted = tokens[watch.start:watch.start + len(offer.tail) + 1]
        matches, missed = draft_outcome(offer.tail, emitted)
        if not (final or missed or matches >= watch.limit):
            return False
        record = self.record(key, matches, missed, watch.first, offer.back)
        if offer.known is not None and offer.scale is not None:
            bands = record.bands.setdefault(offer.scale.name, offer.scale.bands())
            for k, right in zip(offer.known, agreement(offer.tail, emitted), strict=False):
                bands[k].record(right, not right)
        return True

    def record(self, key: str, matches: int, missed: bool, first: bool = False,
               back: bool = True) -> Record:
        """An outcome into the drafter's record (settled here, or scripted by a test)."""
        record = self.record_of(key)
        self.records[key] = record  # the least recently updated drafter goes first
        if record.record(matches, missed, first) and back:
            self.backs[key] = None
            self.heard()
        return record

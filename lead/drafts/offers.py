"""Offer accounting: drafts on offer, verified or not, compared with the tokens lead emits.

An offer shows what drafts are worth even when lead decodes plainly, so every offer is
watched (one at a time) until lead's tokens settle it, and its outcome is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from lead.policy.acceptance import draft_outcome


@dataclass(frozen=True)
class OfferWatch:
    """A draft on offer at position `start`, compared with lead's tokens as they come, over
    as many steps as that takes (a plain step shows at most one token of it)."""

    start: int
    token_ids: tuple[int, ...]
    first: bool  # offered at a reply's first step
    limit: int = 8  # the most draft tokens one outcome covers

    def extended(self, tokens: Sequence[int], draft_ids: Sequence[int]) -> OfferWatch:
        """This watch, or, if a later offer continues its draft, that draft reaching
        further (a back posts its draft a token at a time)."""
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


class OfferLedger:
    """The offers of one reply. `record` receives each settled outcome: (matches, missed,
    first), as CostModel.record_outcome takes it."""

    def __init__(self, record: Callable[[int, bool, bool], None], limit: int) -> None:
        self.record, self.limit = record, limit
        self.watch: OfferWatch | None = None

    def offered(self, tokens: Sequence[int], draft_ids: Sequence[int], first: bool) -> None:
        """A draft was on offer at the step that is about to extend `tokens`. Keep the
        watched offer if this one continues it or it is still open; else record the watched
        one and watch this one."""
        watch = self.watch
        if watch is not None:
            longer = watch.extended(tokens, draft_ids)
            if longer is not watch or not watch.used_up(tokens):
                self.watch = longer
                return
            self.record(*watch.result(tokens), watch.first)
        self.watch = OfferWatch(len(tokens), tuple(draft_ids), first, self.limit)

    def settle(self, tokens: Sequence[int], final: bool = False) -> None:
        """Record the watched offer once `tokens` settle it (`final`: the reply ended)."""
        watch = self.watch
        if watch is None:
            return
        outcome = watch.outcome(tokens, final=final)
        if outcome is not None:
            self.record(*outcome, watch.first)
            self.watch = None

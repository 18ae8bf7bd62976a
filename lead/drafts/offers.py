"""Offer accounting: drafts on offer, verified or not, compared with the tokens lead emits.

An offer shows what drafts are worth even when lead decodes plainly, so every offer is
watched (one at a time) until lead's tokens settle it, and its outcome is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from lead.policy.cost import OfferWatch

Record = Callable[[int, bool, bool], None]  # (matches, missed, first): CostModel.record_outcome


class OfferLedger:
    """The offers of one reply. `record` receives each settled outcome."""

    def __init__(self, record: Record, limit: int) -> None:
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

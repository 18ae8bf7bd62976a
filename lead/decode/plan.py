"""Which drafts a step verifies: each decoding session's offered draft cut to the length
that pays in one batch with the others' (lead/policy/cost.py `allocate`), its context and
its reply; one session's with the branches that pay beside it (a tree). Pure over the cost
model: nothing here touches the model."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from lead.decode.decoder import Job
from lead.decode.session import Session
from lead.drafts.board import Draft
from lead.policy.cost import CostModel
from shared.branch import Branch


class Planner:
    def __init__(self, cost: CostModel, n_ctx: int) -> None:
        self.cost, self.n_ctx = cost, n_ctx

    def price(self, jobs: Sequence[Job]) -> float | None:
        """Seconds the step of `jobs` is priced at (None: nothing priced yet, or no step)."""
        prices = self.cost.prices
        if not jobs or prices.plain_s is None:
            return None
        n = sum(len(j.prompt) or 1 + (j.draft.n_tokens if j.draft else 0) for j in jobs)
        return prices.busy_s(n)

    def plan(self, offers: Sequence[tuple[Session, Draft | None]], max_tokens: Sequence[int],
             base: int) -> list[Draft | None]:
        """Per decoding session, its offered draft cut to what pays in one batch with the
        others' (`base`: tokens the batch holds besides drafts) and fits its context and
        reply (a step emits its accepted tokens and one more); a single session's with the
        branches that pay beside it (a tree)."""
        rooms = [min(self.n_ctx - len(s.tokens), most - s.n_generated - 1)
                 for (s, _), most in zip(offers, max_tokens, strict=True)]
        odds = [self._odds(s, d, max(room, 0)) for (s, d), room in zip(offers, rooms, strict=True)]
        lengths = self.cost.allocate(odds, base)
        return [self._cut(s, d, k, room, len(offers) == 1) if d is not None and k else None
                for (s, d), k, room in zip(offers, lengths, rooms, strict=True)]

    def _odds(self, session: Session, offered: Draft | None, room: int) -> list[float]:
        """Per token of the offered draft (as far as there is room), the odds lead accepts
        it: as it came (lead's own, a back's from its draft model's q), else from the
        acceptance estimate."""
        if offered is None:
            return []
        if offered.odds:
            return list(offered.odds[:room])
        n = min(len(offered.token_ids), room, self.cost.max_draft)
        return self.cost.acceptance.odds(n, session.n_generated == 0)

    def _cut(self, session: Session, offered: Draft, usable: int, room: int, single: bool
             ) -> Draft:
        dists = offered.dists[:usable] if offered.dists else None
        roots = tuple((b.at, b.token_ids[0]) for b in offered.branches if b.at < usable)
        tree = self._tree(offered.branches, usable, room, self.n_ctx -
                          len(session.tokens) + 1, session.n_generated == 0) if single else ()
        return Draft(offered.back_id, offered.token_ids[:usable], dists, offered.branch,
                     tree, roots)

    def _tree(self, offered: tuple[Branch, ...], k: int, room: int, most: int, first: bool
              ) -> tuple[Branch, ...]:
        """The offered branches that pay beside a draft of k (the cost model's tree_width of
        them at most), cut to the length that pays and reaches no further than `room`;
        `most` tokens in the batch."""
        lengths = self.cost.branches(k, [(b.at, min(len(b.token_ids), room - b.at))
                                         for b in offered], most, first)
        return tuple(replace(b, token_ids=b.token_ids[:n], dists=b.dists[:n] if b.dists else None)
                     for b, n in zip(offered, lengths, strict=True) if n)

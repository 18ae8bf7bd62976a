"""Which drafts a step verifies: each decoding session's offered draft cut to the length
that pays in one batch with the others' (lead/policy/cost.py `allocate`), its context and
its reply. Pure over the cost model: nothing here touches the model."""

from __future__ import annotations

from collections.abc import Sequence

from lead.decode.decoder import Job
from lead.decode.session import Session
from lead.drafts.board import Draft
from lead.policy.cost import CostModel


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
        reply (a step emits its accepted tokens and one more)."""
        rooms = [min(self.n_ctx - len(s.tokens), most - s.n_generated - 1)
                 for (s, _), most in zip(offers, max_tokens, strict=True)]
        p_accept = [self._p_accept(s, d, max(room, 0))
                    for (s, d), room in zip(offers, rooms, strict=True)]
        lengths = self.cost.allocate(p_accept, base)
        return [_cut(d, k) if d is not None and k else None
                for (_, d), k in zip(offers, lengths, strict=True)]

    def _p_accept(self, session: Session, offered: Draft | None, room: int) -> list[float]:
        """Per token of the offered draft (as far as there is room), the probability lead accepts
        it: as the board learned it (per band of what its drafter knows of each), else
        from its drafter's record on the scoreboard."""
        if offered is None:
            return []
        if offered.p_accept:
            return list(offered.p_accept[:room])
        n = min(len(offered.token_ids), room, self.cost.max_draft)
        return self.cost.scores.record_of(offered.drafter).p_accept(n, session.n_generated == 0)


def _cut(offered: Draft, usable: int) -> Draft:
    dists = offered.dists[:usable] if offered.dists else None
    return Draft(offered.back_id, offered.token_ids[:usable], dists, offered.branch)

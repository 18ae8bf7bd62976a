"""The live panel's data (GET /duo/live): a snapshot of lead built from its parts, the
replies it remembers, and the news that wakes the panel's streams.

`snapshot` is a pure function of what it is given; `LiveNews` holds the little state.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from lead.backs.registry import BackRecord
from lead.decode.metrics import Metrics
from lead.decode.session import Session
from lead.policy.cost import CostModel
from lead.policy.prices import Prices
from shared.broadcast import Broadcast

REPLIES_KEPT = 60  # the rolling plot's width


def reply_view(number: int, s: Session, now: float) -> dict[str, Any]:
    """A finished reply as the panel shows it (`number`: replies since lead started, this
    one included); its rate is over decoding, after the prompt."""
    seconds = max(now - s.t_decode, 0.0) if s.t_decode else 0.0
    return {"n": number, "tokens": s.n_generated, "tok_s": _ratio(s.n_generated, seconds),
            "drafted": s.drafted, "accepted": s.accepted,
            "acceptance": _ratio(s.accepted, s.drafted),
            "from_drafts": _ratio(s.accepted, s.n_generated), "finish": s.finish_reason or ""}


class LiveNews:
    """A version that grows with every change the panel shows, and the last replies."""

    def __init__(self, kept: int = REPLIES_KEPT) -> None:
        self.news = Broadcast()
        self.replies: deque[dict[str, Any]] = deque(maxlen=kept)
        self.closed = False
        self._count = 0

    @property
    def version(self) -> int:
        return self.news.version

    def bump(self) -> None:
        self.news.bump()

    def add_reply(self, session: Session, now: float) -> None:
        self._count += 1
        self.replies.append(reply_view(self._count, session, now))
        self.bump()

    def close(self) -> None:
        """End every stream (lead is shutting down)."""
        self.closed = True
        self.bump()

    async def wait(self, since: int, timeout: float) -> None:
        """Return once the version passes `since`, lead closes, or at timeout."""
        await self.news.wait(lambda: self.version > since or self.closed, timeout)


def snapshot(*, model: str, busy: bool, cost: CostModel, metrics: Metrics,
             backs: Mapping[str, BackRecord], replies: Iterable[dict[str, Any]], now: float,
             version: int, slots: list[dict[str, Any]] | None = None, waiting: int = 0
             ) -> dict[str, Any]:
    """What the live panel shows, as JSON-ready data. `backs`: those connected; `now`: on
    the clock their `last_seen` is read on; `slots`: what each slot holds (Engine.slot_views),
    `waiting`: requests queued behind them."""
    generated = metrics.generated_tokens
    return {"version": version, "model": model, "busy": busy,
            "slots": slots or [], "waiting": waiting,
            "tok_s": _ratio(generated, metrics.decode_seconds),
            "totals": {"replies": metrics.requests, "tokens": generated,
                       "drafted": metrics.drafted, "accepted": metrics.accepted},
            "draft": _draft_view(cost), "verify_cost": _prices_view(cost.prices),
            "backs": [_back_view(i, r, generated, now) for i, r in sorted(backs.items())],
            "replies": list(replies)}


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b else None


def _draft_view(cost: CostModel) -> dict[str, Any]:
    return {"length": cost.verify_len(), "asked": cost.draft_len(), "max": cost.max_draft,
            "fixed": cost.fixed is not None, "acceptance": round(cost.alpha, 4),
            "acceptance_measured": cost.scores.leader.measured, "hush": cost.hush,
            "probing": cost.probes.probing > 0, "slowdown": round(cost.prices.slowdown, 3)}


def _prices_view(prices: Prices) -> dict[str, Any]:
    one = prices.plain_s
    return {"one_token_ms": round(one * 1000, 3) if one is not None else None,
            "sizes": [{"b": b, "x": round(x, 3)} for b, x in sorted(prices.shape.items())]}


def _back_view(back_id: str, r: BackRecord, generated: int, now: float) -> dict[str, Any]:
    return {"id": back_id, "address": r.address, "kind": r.kind, "sits_out": r.sits_out,
            "seen_ago_s": round(max(now - r.last_seen, 0.0), 1), "drafted": r.drafted,
            "accepted": r.accepted, "acceptance": _ratio(r.accepted, r.drafted),
            "share": _ratio(r.accepted, generated)}


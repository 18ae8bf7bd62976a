"""One generation as the engine's loop holds it: its request and session, its slot, what is
left of its prompt to evaluate, and the emissions waiting for its reader; what its slot shows
(the metrics and the web page's live panel). Event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lead.decode.session import Emission, GenRequest, Session
from lead.decode.textstream import TextStream
from lead.drafts.board import DraftBoard
from lead.drafts.offers import OfferLedger
from lead.drafts.own import OWN


@dataclass
class Run:
    req: GenRequest
    session: Session
    offers: OfferLedger
    text: TextStream = field(init=False)
    slot: int | None = None  # None: waiting for one
    todo: list[int] = field(default_factory=list)  # prompt tokens its slot still lacks
    after_rejection: bool = False  # the step before rejected a draft token
    ended: bool = False
    _out: asyncio.Queue[Emission | BaseException] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.text = self.req.text() if self.req.text is not None else TextStream(self.req.stop)

    @property
    def decoding(self) -> bool:
        """Seated with its whole prompt cached: its steps verify."""
        return self.slot is not None and not self.todo

    def emit(self, emission: Emission) -> None:
        self._out.put_nowait(emission)

    def fail(self, error: BaseException) -> None:
        """End the reply with `error`, raised to its reader."""
        self.ended = True
        self._out.put_nowait(error)

    async def emissions(self) -> AsyncIterator[Emission]:
        """What the loop decides for this run, in order, up to its last emission (the one
        carrying the session), or the error that ended it."""
        while True:
            item = await self._out.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.session is not None:
                return


def slot_view(slot: int, run: Run | None, board: DraftBoard | None) -> dict[str, object]:
    """What slot `slot` holds: idle, or `run` (a prompt being evaluated or a reply decoding)
    with its counts and the backs whose drafts are on its `board`."""
    if run is None:
        return {"slot": slot, "state": "idle"}
    s = run.session
    backs = sorted({c.back_id for kept in board.candidates.values() for c in kept} - {OWN}) \
        if board is not None else []
    return {"slot": slot, "state": "prompt" if run.todo else "decoding",
            "prompt_left": len(run.todo), "tokens": s.n_generated, "drafted": s.drafted,
            "accepted": s.accepted, "own_accepted": s.accepted_by_back.get(OWN, 0),
            "backs": backs}

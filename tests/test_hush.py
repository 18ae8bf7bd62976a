"""Lead hushes a back that slows it (in process: fake models that really contend)."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.worker import Worker
from lead.app import create_app
from shared.fake import FakeModel
from tests.conftest import async_wait_until, make_settings
from tests.test_inprocess import ask, run, with_workers


class BusyDraft(FakeModel):
    """A draft model that says when it computes."""

    busy = False

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None = None) -> None:
        self.busy = True
        try:
            super()._spend(n_tokens, abort)
        finally:
            self.busy = False


class Contended(FakeModel):
    """A target sharing its CPU with the draft model: 3x slower while that computes."""

    def __init__(self, draft: BusyDraft, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.draft = draft

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None = None) -> None:
        time.sleep((3.0 if self.draft.busy else 1.0) * (0.003 + 0.0005 * n_tokens))


def test_lead_hushes_a_back_that_slows_it_and_the_hushed_back_takes_in_nothing() -> None:
    async def body() -> None:
        draft = BusyDraft(salt="draft", agree=0.0, cost_s=(0.01, 0.0))  # slow, always wrong
        app = create_app(make_settings(max_tokens=120), Contended(draft, eos_bias=-100.0))
        transport = httpx.ASGITransport(app=app)
        engine = app.state.engine  # type: ignore[attr-defined]
        client = LeadClient("http://lead", transport=transport, poll_wait=1.0)
        worker = Worker(client, ModelDrafter(draft), draft.fingerprint(), draft.n_vocab)

        def hushed_for_a_while() -> bool:  # and no probe due within the next reply
            cost = engine.cost
            return cost.hush and cost.probe_gap - cost.since_probe > 12

        async def check() -> None:
            await async_wait_until(lambda: worker.state.version >= 0, what="back handshake")
            for _ in range(8):
                await ask(transport, max_tokens=60)
                if hushed_for_a_while():
                    break
            assert hushed_for_a_while(), "lead never hushed the back that slowed it"
            assert worker.state.hush  # lead told the back
            before = draft.evaluated
            reply = await ask(transport, "a prompt the back has not seen", max_tokens=8)
            assert reply["usage"]["drafted_tokens"] == 0
            assert draft.evaluated == before  # it did not even take in the new prompt

        await with_workers([worker], check)
    run(body())

"""Backs that would slow lead stay quiet: beside lead, sitting out, or hushed by lead.
In process, over HTTP and the link, with fake models (some of which really contend)."""

from __future__ import annotations

from collections.abc import Callable

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.worker import Worker
from bench.fake import FakeModel, VirtualClock
from lead.server.app import create_app
from shared.placement import Placement
from shared.wire.protocol import SessionState, Stop, Update
from tests.conftest import InProcessLead, async_wait_until, make_settings
from tests.test_inprocess import ask, model_worker, new_lead, run, with_workers


class BusyDraft(FakeModel):
    """A draft model that says when it computes."""

    busy = False

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None, started: float) -> None:
        self.busy = True
        try:
            super()._spend(n_tokens, abort, started)
        finally:
            self.busy = False


class Contended(FakeModel):
    """A target sharing its CPU with the draft model: 3x slower while that computes. Its
    verify batches cost nearly b times a token, as on a CPU: perfect drafts pay only quiet."""

    def __init__(self, draft: BusyDraft, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.draft = draft

    def cost_of(self, n_tokens: int) -> float:
        return (3.0 if self.draft.busy else 1.0) * (0.001 + 0.003 * n_tokens)


def test_lead_hushes_a_back_that_slows_it_and_the_hushed_back_takes_in_nothing() -> None:
    async def body() -> None:
        draft = BusyDraft(salt="draft", agree=0.0, cost_s=(0.01, 0.0))  # slow, always wrong
        clock = VirtualClock()  # steps priced at their nominal cost, however loaded the machine
        target = Contended(draft, eos_bias=-100.0, clock=clock)
        app = create_app(make_settings(max_tokens=120), target, clock=clock)
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            client = LeadClient("http://lead", transport=transport)
            worker = Worker(client, ModelDrafter(draft), draft.fingerprint(), draft.n_vocab)
            news: list[SessionState] = []  # what lead told the back of each session
            take = worker._take

            def taking(update: Update) -> None:
                news.extend(update.sessions)
                take(update)
            worker._take = taking  # type: ignore[method-assign]

            def hushed_for_a_while() -> bool:  # and no probe due within the next reply
                cost = engine.cost
                return cost.hush and cost.probes.gap - cost.probes.since > 12

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                for i in range(8):  # new prompts: a repeated one, the back would draft from cache
                    await ask(transport, f"prompt number {i}", max_tokens=60)
                    if hushed_for_a_while():
                        break
                assert hushed_for_a_while(), "lead never hushed the back that slowed it"
                before, told = draft.evaluated, len(news)
                reply = await ask(transport, "a prompt the back has not seen", max_tokens=8)
                assert reply["usage"]["drafted_tokens"] == 0
                assert draft.evaluated == before  # it did not even take in the new prompt
                live = [n.stop for n in news[told:] if not n.done]
                assert live and set(live) == {Stop.SLOWED}  # lead told the back why

            await with_workers([worker], check)
    run(body())


def placed(worker: Worker, placement: Placement) -> Worker:
    async def attach(_: object) -> Placement:
        return placement
    worker.on_attach = attach
    return worker


def test_a_back_beside_lead_takes_in_nothing_while_lead_wants_no_drafts() -> None:
    async def body() -> None:
        app, _ = new_lead(draft_len=0)  # lead never asks for drafts
        async with InProcessLead(app) as transport:
            beside = placed(model_worker(transport), Placement(frozenset({1}), 1, beside_lead=True))
            remote = model_worker(transport, back_id="remote")  # catches up: costs lead nothing

            async def check() -> None:
                await async_wait_until(lambda: beside.version >= 0 <= remote.version,
                                       what="handshakes")
                await ask(transport, "a long prompt " * 8, max_tokens=16)
                await async_wait_until(lambda: remote.batcher.drafters[0].model.evaluated > 0,  # type: ignore
                                       what="the remote back to take in the prompt")
                assert beside.batcher.drafters[0].model.evaluated == 0  # type: ignore[attr-defined]

            await with_workers([beside, remote], check)
    run(body())


def test_a_back_sitting_out_does_nothing_even_when_lead_wants_drafts() -> None:
    async def body() -> None:
        app, _ = new_lead(draft_len=4)  # lead always wants drafts
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            idle = placed(model_worker(transport, agree=1.0), Placement(None, 1, sit_out=True))

            async def check() -> None:
                await async_wait_until(lambda: idle.version >= 0, what="handshake")
                updates = engine.metrics.link_updates
                reply = await ask(transport, max_tokens=40)
                assert reply["usage"]["drafted_tokens"] == 0
                assert idle.batcher.drafters[0].model.evaluated == 0  # type: ignore[attr-defined]
                # told of the start and the end, not of each step
                assert engine.metrics.link_updates - updates <= 3

            await with_workers([idle], check)
    run(body())

"""Lead app + back worker in one process, over HTTP and the link (fake target and draft)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import httpx
import pytest

from back.client import LeadClient
from back.drafter import ModelDrafter, NgramDrafter
from back.worker import BackFatal, Worker
from bench.fake import FakeModel, VirtualClock
from lead.server.app import create_app
from tests.conftest import InProcessLead, async_wait_until, make_settings

TARGET_COST = (0.003, 0.0005)  # seconds per call, per token: slow enough to overlap with backs


def new_lead(cost_s: tuple[float, float] = TARGET_COST, kind: type[FakeModel] = FakeModel,
             **settings: object) -> tuple[object, FakeModel]:
    """A lead over a fake target that prices its steps at their nominal cost, exactly."""
    clock = VirtualClock()
    target = kind(cost_s=cost_s, eos_bias=-100.0, clock=clock)  # long replies: no early EOS
    return create_app(make_settings(max_tokens=120, **settings), target, clock=clock), target


def model_worker(transport: httpx.AsyncBaseTransport, agree: float = 0.8,
                 salt: str = "draft", back_id: str = "m") -> Worker:
    draft = FakeModel(salt=salt, agree=agree, cost_s=(0.0005, 0.0))
    client = LeadClient("http://lead", transport=transport)
    return Worker(client, ModelDrafter(draft), draft.fingerprint(), draft.n_vocab, back_id=back_id)


async def ask(transport: httpx.AsyncBaseTransport, text: str = "hello there",
              max_tokens: int = 120) -> dict:
    async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens})
        assert r.status_code == 200, r.text
        return r.json()


def text_of(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


async def with_workers(workers: list[Worker], body: Callable[[], Awaitable[None]]) -> None:
    tasks = [asyncio.create_task(w.run()) for w in workers]
    try:
        await body()
    finally:
        for w, t in zip(workers, tasks, strict=True):
            w.stop()
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def reference(text: str = "hello there", max_tokens: int = 120) -> str:
    app, _ = new_lead()
    return text_of(await ask(httpx.ASGITransport(app=app), text, max_tokens))


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


def test_output_with_back_equals_output_without() -> None:
    async def body() -> None:
        alone = await reference()
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport)
                assert text_of(reply) == alone
                assert reply["usage"]["accepted_tokens"] > 0

            await with_workers([worker], check)
    run(body())


def test_always_wrong_draft_costs_no_correctness() -> None:
    async def body() -> None:
        alone = await reference()
        app, _ = new_lead(draft_len=4)
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=0.0, salt="nonsense")

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport)
                assert text_of(reply) == alone
                assert reply["usage"]["drafted_tokens"] > 0
                assert reply["usage"]["accepted_tokens"] <= reply["usage"]["drafted_tokens"] // 10

            await with_workers([worker], check)
    run(body())


def test_back_joining_mid_generation_helps_that_reply() -> None:
    async def body() -> None:
        alone = await reference(max_tokens=200)
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            reply_task = asyncio.create_task(ask(transport, max_tokens=200))
            await async_wait_until(lambda: engine.session is not None
                                   and engine.session.n_generated >= 40, what="40 tokens alone")
            assert engine.session.accepted == 0
            worker = model_worker(transport)
            await with_workers([worker], lambda: asyncio.shield(reply_task))  # type: ignore[arg-type]
            reply = reply_task.result()
            assert text_of(reply) == alone
            assert reply["usage"]["accepted_tokens"] > 0
    run(body())


def test_a_back_lead_wants_no_drafts_from_still_takes_in_the_prompt() -> None:
    async def body() -> None:
        app, _ = new_lead(draft_len=0)  # lead never asks for drafts
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            worker = model_worker(transport)

            async def reply_and_check() -> None:
                reply_task = asyncio.create_task(ask(transport, "a long prompt " * 8))
                await async_wait_until(lambda: engine.session is not None, what="a session")
                prompt = engine.session.tokens[: engine.session.n_prompt]
                drafter = worker.batcher.drafters[0]
                await async_wait_until(lambda: drafter.local[: len(prompt)] == prompt,
                                       what="the back to take in the prompt")
                reply = await reply_task
                assert reply["usage"]["drafted_tokens"] == 0
                assert engine.metrics.drafts_posted == 0  # it took the tokens in, drafted none

            await with_workers([worker], reply_and_check)
    run(body())


def test_where_verify_cost_is_linear_lead_never_wakes_a_back() -> None:
    async def body() -> None:
        alone = await reference()
        app, _ = new_lead(cost_s=(0.0, 0.004))  # b tokens cost b times one: nothing can pay
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            worker = model_worker(transport, agree=1.0)  # a perfect draft model

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport)
                assert text_of(reply) == alone and reply["usage"]["drafted_tokens"] == 0
                assert engine.metrics.drafts_posted == 0  # not asked, not even in probes

            await with_workers([worker], check)
    run(body())


class FourIsCheap(FakeModel):
    """A target whose kernels evaluate 4 tokens faster than 2 or 3 (as on one Xeon)."""

    def cost_of(self, n_tokens: int) -> float:
        return 0.003 * {2: 2.0, 3: 3.0, 4: 1.2}.get(n_tokens, n_tokens)


def test_short_drafts_are_verified_in_the_cheaper_batch_of_four() -> None:
    async def body() -> None:
        alone = await reference()
        app, target = new_lead(kind=FourIsCheap)
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=0.9)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                target.calls.clear()  # calibration's
                reply = await ask(transport)
                assert text_of(reply) == alone and reply["usage"]["accepted_tokens"] > 0
                assert not {2, 3} & set(target.calls[1:])  # after the prompt: 1 or 4 tokens
                # and drafts of 1-2 tokens were verified too, padded to 4 (unpadded, a batch of
                # 4 would always hold 3 draft tokens)
                assert reply["usage"]["drafted_tokens"] < 3 * target.calls.count(4)

            await with_workers([worker], check)
    run(body())


class SharedCpu(FakeModel):
    """A target whose every evaluation costs `factor` times its price (the test raises it
    while a back drafts beside it)."""

    factor = 1.0

    def cost_of(self, n_tokens: int) -> float:
        return self.factor * super().cost_of(n_tokens)


def test_steps_while_a_back_drafts_are_priced_apart() -> None:
    async def body() -> None:
        # (no memory of the first reply: lead would draft the second from it, not the back)
        app, target = new_lead(kind=SharedCpu, ngram_memory=0)
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            quiet = target.cost_of(1)
            await ask(transport)  # lead alone: every step is quiet
            prices = engine.cost.prices
            assert prices.slowdown == 1.0 and prices.plain_s == pytest.approx(quiet)
            worker = model_worker(transport, agree=1.0)  # perfect drafts: wanted at every step

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                target.factor = 1.5  # type: ignore[attr-defined]
                assert (await ask(transport))["usage"]["accepted_tokens"] > 0
                # busy steps leave the quiet price alone and show how much slower they are
                assert engine.cost.prices.plain_s == pytest.approx(quiet)
                assert engine.cost.prices.slowdown == pytest.approx(1.5, abs=0.1)

            await with_workers([worker], check)
    run(body())


def test_back_dropping_mid_generation_lead_finishes_alone() -> None:
    async def body() -> None:
        alone = await reference(max_tokens=200)
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            engine = app.state.engine  # type: ignore[attr-defined]
            worker = model_worker(transport)
            task = asyncio.create_task(worker.run())
            await async_wait_until(lambda: worker.version >= 0, what="back handshake")
            reply_task = asyncio.create_task(ask(transport, max_tokens=200))
            await async_wait_until(
                lambda: engine.session is not None and engine.session.accepted > 5,
                what="drafts accepted")
            task.cancel()  # the back vanishes mid-reply
            await asyncio.gather(task, return_exceptions=True)
            at_drop = engine.session.n_generated
            assert at_drop < 200
            reply = await reply_task
            assert text_of(reply) == alone
            assert reply["usage"]["completion_tokens"] == 200
    run(body())


def test_lead_restart_back_reconnects_and_helps_next_reply() -> None:
    async def body() -> None:
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport)

            async def scenario() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                first = await ask(transport)
                transport.down()  # lead goes down...
                await async_wait_until(lambda: worker.backoff.outages >= 1,
                                       what="back to notice the outage")
                new_app, _ = new_lead()
                transport.lead = new_app  # ...and comes back with version counters reset
                second = await ask(transport)
                assert text_of(second) == text_of(first)
                assert second["usage"]["accepted_tokens"] > 0

            await with_workers([worker], scenario)
    run(body())


def test_ngram_back_and_model_back_together() -> None:
    async def body() -> None:
        text = "abc abc abc abc abc"
        alone = await reference(text)
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            ngram = Worker(LeadClient("http://lead", transport=transport),
                           NgramDrafter(), None, None, back_id="ngram")
            workers = [model_worker(transport), ngram]

            async def check() -> None:
                await async_wait_until(lambda: all(w.version >= 0 for w in workers),
                                       what="both backs")
                reply = await ask(transport, text)
                assert text_of(reply) == alone
                assert app.state.feed.backs.active() == 2  # type: ignore[attr-defined]

            await with_workers(workers, check)
    run(body())


def test_incompatible_draft_model_is_refused() -> None:
    async def body() -> None:
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            client = LeadClient("http://lead", transport=transport)
            worker = Worker(client, ModelDrafter(FakeModel(n_vocab=80)), "other", 80)
            with pytest.raises(BackFatal, match="does not match lead's .*: vocabulary"):
                await worker.run()
    run(body())


def test_a_session_longer_than_the_draft_context_is_sat_out_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        long_text = "a long prompt " * 8
        alone = await reference(long_text, 40)
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            draft = FakeModel(salt="draft", agree=0.9, cost_s=(0.0005, 0.0), n_ctx=80)
            worker = Worker(LeadClient("http://lead", transport=transport),
                            ModelDrafter(draft), draft.fingerprint(), draft.n_vocab,
                            back_id="small")
            task = asyncio.create_task(worker.run())

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                assert text_of(await ask(transport, long_text, 40)) == alone
                assert not task.done()  # the back lives on, and helps a reply that fits
                short = await ask(transport, "hi", 30)
                assert short["usage"]["accepted_tokens"] > 0, short["usage"]
            try:
                await check()
            finally:
                worker.stop()
                await asyncio.gather(task, return_exceptions=True)
            assert "more than this draft model's context" in caplog.text
    run(body())


def test_lead_verifies_no_draft_past_max_tokens() -> None:
    async def body() -> None:
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=1.0)  # every draft right: long ones pay

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                await ask(transport, "warm up the cost model", 60)
                usages = [(await ask(transport, f"short {i}", 6))["usage"] for i in range(4)]
                for u in usages:  # a step emits its accepted tokens and one of its own
                    assert u["completion_tokens"] == 6, u
                    assert u["accepted_tokens"] <= u["drafted_tokens"] <= 5, u
                assert sum(u["accepted_tokens"] for u in usages) > 0, usages

            await with_workers([worker], check)
    run(body())


def test_sampling_back_posts_distributions_and_seeded_requests_repeat() -> None:
    async def body() -> None:
        # When sampling, a draft whose first token lead has already sampled differently is
        # stale; a target about as fast as the back's post cycle can lose that race for a
        # whole reply (1 run in 20). Give the draft the lead a real one has.
        app, _ = new_lead(cost_s=(0.012, 0.001))
        async with InProcessLead(app) as transport:
            feed = app.state.feed  # type: ignore[attr-defined]
            posted_dists: list[bool] = []
            original = feed.post_draft

            def spy(session_id, start, token_ids, dists, *rest, **kw):  # type: ignore[no-untyped-def]
                posted_dists.append(dists is not None)
                return original(session_id, start, token_ids, dists, *rest, **kw)

            feed.post_draft = spy

            async def sampled(seed: int) -> dict:
                async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
                    r = await http.post("/v1/chat/completions", json={
                        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60,
                        # Peaked enough that, after a rejection, back's next first guess often
                        # matches lead's own sample (chance sum(p*q)), as with real LLMs.
                        "temperature": 0.3, "top_k": 20, "seed": seed})
                    return r.json()

            alone = [text_of(await sampled(11)) for _ in range(2)]
            assert alone[0] == alone[1]  # same seed, no drafts: same output
            assert text_of(await sampled(12)) != alone[0]
            worker = model_worker(transport, agree=0.9)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await sampled(13)
                assert reply["usage"]["accepted_tokens"] > 0, (reply["usage"], len(posted_dists))
                assert posted_dists and all(posted_dists)

            await with_workers([worker], check)
    run(body())

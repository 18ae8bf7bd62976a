"""The engine's jobs one at a time: admission, the decoder's step, offer accounting and
the back feed, each without the others (fake model, virtual clock, no HTTP)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.fake import EOS, FakeModel, VirtualClock
from lead.backs.feed import BackFeed, is_news
from lead.backs.limits import PostLimiter
from lead.decode.admission import Admission, QueueFull
from lead.decode.decoder import Decoder, Job, Step
from lead.decode.metrics import Metrics
from lead.decode.plan import Planner
from lead.decode.runs import Run
from lead.decode.session import Emission, GenRequest, Session, StepResult, merged
from lead.decode.verify import Verdict
from lead.drafts.board import Draft
from lead.policy.cost import CostModel
from shared.logprobs import TokenLogprob
from shared.modelthread import ModelThread
from shared.wire.protocol import SamplingParams
from tests.conftest import async_wait_until


def session(prompt: list[int], sid: str = "s1", generated: list[int] | None = None) -> Session:
    return Session(id=sid, tokens=[*prompt, *(generated or [])], n_prompt=len(prompt),
                   params=SamplingParams(), rng=np.random.default_rng(0))


# --- admission ---


def test_one_runs_max_queue_wait_in_order_and_the_rest_are_refused() -> None:
    async def body() -> None:
        admission = Admission(max_queue=2)
        order: list[int] = []
        release = asyncio.Event()

        async def request(i: int) -> None:
            async with admission.reserve().turn():
                order.append(i)
                await release.wait()

        tasks = [asyncio.create_task(request(i)) for i in range(3)]
        await async_wait_until(lambda: order == [0] and admission.waiting == 2, what="queue")
        with pytest.raises(QueueFull):  # at once, not after a wait
            await asyncio.wait_for(admission.reserve().turn().__aenter__(), 1)
        release.set()
        await asyncio.gather(*tasks)
        assert order == [0, 1, 2] and admission.waiting == 0 and not admission.running
    asyncio.run(body())


def test_a_cancelled_waiter_gives_its_place_back() -> None:
    async def body() -> None:
        admission = Admission(max_queue=1)
        release = asyncio.Event()

        async def hold() -> None:
            async with admission.reserve().turn():
                await release.wait()

        running = asyncio.create_task(hold())
        waiter = asyncio.create_task(hold())
        await async_wait_until(lambda: admission.waiting == 1, what="a waiter")
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert admission.waiting == 0
        second = asyncio.create_task(hold())  # the freed place is taken, not refused
        await async_wait_until(lambda: admission.waiting == 1, what="the next waiter")
        release.set()
        await asyncio.gather(running, second)
    asyncio.run(body())


# --- back feed ---


@pytest.mark.parametrize(("quiet", "idle", "wanted", "done", "news"), [
    (False, False, 0, False, True),  # a back that drafts for it: every change
    (True, False, 3, False, True),  # drafts wanted of a quiet session
    (True, False, 0, False, False),  # quiet, nothing wanted: no news
    (True, True, 3, False, False),  # sitting out: not even drafts wanted
    (False, True, 3, False, False),  # (on the link, a back sitting out quiets nothing)
    (True, True, 0, True, True),  # the session ended
])
def test_which_change_is_news_to_which_back(quiet: bool, idle: bool, wanted: int, done: bool,
                                            news: bool) -> None:
    assert is_news(done, quiet, idle, lambda: wanted) is news


def test_posts_reach_the_board_only_for_the_live_session() -> None:
    metrics = Metrics()
    feed = BackFeed(CostModel(max_draft=8, fixed=4), metrics)
    assert not feed.post_draft("s1", 2, [5], None, "b")  # no session yet
    s = session([1, 2])
    feed.start(s)
    assert feed.post_draft("s1", 2, [5, 6], None, "b")
    assert not feed.post_draft("other", 2, [5], None, "b")
    assert not feed.post_draft("s1", 0, [9, 9, 9], None, "b")  # disagrees with lead's tokens
    assert (metrics.drafts_posted, metrics.drafts_stale) == (4, 3)
    board = feed.board_of(s.id)
    assert board is not None
    best = board.best(s.tokens, 8)
    assert best is not None and best.token_ids == [5, 6]
    state = feed.session_state(feed.followed["s1"], 1, "b")
    assert state.session_id == "s1" and state.token_ids == [2] and state.draft_len == 4


def test_only_a_back_that_drafts_makes_a_step_busy() -> None:
    feed = BackFeed(CostModel(max_draft=8, fixed=4), Metrics())
    s = session([1, 2])
    feed.start(s)
    feed.back_seen("b", sits_out=True)  # its hello said idle: it sits out
    assert feed.backs.active() == 1 and not feed.back_drafting(s)
    feed.back_seen("b")  # it says it drafts when asked
    assert feed.back_drafting(s)
    feed.back_seen("b", sits_out=True)
    feed.post_draft("s1", 2, [5], None, "b")  # a post: it drafts after all
    assert feed.back_drafting(s)


@pytest.mark.parametrize("rate", [0.25, 0.5, 3.0])
def test_any_positive_post_rate_admits_posts_at_that_rate(rate: float) -> None:
    limiter = PostLimiter(rate)
    allowed = sum(limiter.allow("10.0.0.1", "b", now=t / 100) for t in range(2000))
    assert allowed == pytest.approx(20 * rate, abs=max(rate, 1.0))  # 20 s, one burst


# --- decoder ---


def decoder(model: FakeModel, clock: VirtualClock, fixed: int | None = 4) -> Decoder:
    return Decoder(model, CostModel(max_draft=8, fixed=fixed), ModelThread("t"), clock)


def test_a_step_verifies_the_draft_and_is_timed_on_the_clock() -> None:
    clock = VirtualClock()
    model = FakeModel(cost_s=(0.01, 0.001), clock=clock)
    prompt = [5, 6, 7]
    right = model.greedy_continuation(prompt, 3)
    wrong = next(t for t in range(1, 10) if t != right[2])
    dec = decoder(model, clock)
    s = session(prompt)

    async def body() -> Step:
        assert await dec.seat(prompt, [0]) == (0, 0)  # slot 0, nothing of it cached
        chunk = await dec.step([Job(0, (), 0, s.params, s.rng, prompt=tuple(prompt[:-1]))])
        assert chunk.results == [None] and chunk.seconds == pytest.approx(0.01 + 0.001 * 2)
        draft = Draft("b", [right[0], right[1], wrong], None)
        return await dec.step([Job(0, tuple(prompt), 3, s.params, s.rng, draft)])

    step = asyncio.run(body())
    dec.thread.shutdown()
    result = step.results[0]
    assert result is not None and result.verdict.emitted == right  # two accepted, one fixed
    assert step.seconds == pytest.approx(0.01 + 0.001 * 4)  # exact: the virtual clock
    assert model.cached == prompt + right[:2]  # the rejected rows are cut from the cache


def test_a_plan_fits_the_draft_to_the_reply_and_the_context() -> None:
    planner = Planner(CostModel(max_draft=8, fixed=8), n_ctx=12)
    offered = Draft("b", [1, 2, 3, 4, 5, 6], None)

    def plan(s: Session, draft: Draft | None, max_tokens: int) -> Draft | None:
        return planner.plan([(s, draft)], [max_tokens], 1)[0]

    cut = plan(session([1, 2, 3]), offered, max_tokens=4)
    assert cut is not None and cut.token_ids == [1, 2, 3]  # with its own token: 4
    cut = plan(session(list(range(1, 10))), offered, max_tokens=100)
    assert cut is not None and cut.token_ids == [1, 2, 3]  # the context holds 3 more
    assert plan(session([1, 2]), offered, max_tokens=1) is None
    assert plan(session([1, 2]), None, max_tokens=10) is None


def result(accepted: list[int], next_token: int, drafted: int) -> StepResult:
    return StepResult(Verdict(accepted, next_token), drafted + 1, 0.01, "b")


def applied(s: Session, res: StepResult, max_tokens: int = 50, stop: list[str] | None = None
            ) -> list[Emission]:
    """`res` applied to `s` by its run; the emissions its reader gets."""
    run = Run(GenRequest(list(s.tokens), max_tokens, stop=stop or []), s)
    run.apply(res, FakeModel(), grammar_s=1.0)
    out = []
    while not run._out.empty():
        out.append(run._out.get_nowait())
    return out


def test_apply_cuts_at_max_tokens_and_counts_only_what_was_emitted() -> None:
    s = session([1, 2], generated=[3])
    out = applied(s, result([4, 5, 6], 7, drafted=3), max_tokens=3)
    assert s.tokens == [1, 2, 3, 4, 5] and s.finish_reason == "length"
    assert (s.drafted, s.accepted, s.accepted_by_back, s.steps) == (3, 2, {"b": 2}, 1)
    assert sum(e.n_tokens for e in out) == 2 and out[-1].session is s  # the end, last


def test_apply_stops_at_an_eos() -> None:
    s = session([1, 2])
    out = applied(s, result([4, EOS, 6], 7, drafted=4))
    assert s.tokens == [1, 2, 4, EOS] and s.finish_reason == "stop"
    assert (s.accepted, s.rejections) == (2, 1)  # none counted past the EOS
    assert [e.n_from_draft for e in out] == [2, 0]  # both tokens, then the end


def test_apply_drops_the_tokens_past_a_stop_string_but_counts_their_acceptance() -> None:
    model = FakeModel()
    text = [model.token_bytes(t).decode() for t in (4, 5, 6)]
    s = session([1, 2])
    out = applied(s, result([4, 5, 6], 7, drafted=3), stop=[text[1]])
    assert s.tokens == [1, 2, 4, 5] and (s.finish_reason, s.stop_sequence) == ("stop", text[1])
    assert s.accepted == 3 and "".join(e.text for e in out) == text[0]


def test_a_step_s_tokens_go_out_as_one_event_per_source() -> None:
    def one(text: str, back: str = "", token: int = 0) -> Emission:
        return Emission(text, 1, int(bool(back)), back=back,
                        logprobs=[TokenLogprob(token, -0.5, ())])

    step = [one("de", "b1", 1), one("f ", "b1", 2), one("x", "b1", 3), one("(", token=4)]
    out = merged(step)
    assert [(e.text, e.n_tokens, e.n_from_draft, e.back) for e in out] == \
        [("def x", 3, 3, "b1"), ("(", 1, 0, "")]
    assert [lp.token_id for lp in out[0].logprobs] == [1, 2, 3]  # each token's, in order
    assert "".join(e.text for e in out) == "".join(e.text for e in step)
    other = merged([one("a", "b1"), one("b", "b2"), one("c"), one("d")])
    assert [e.text for e in other] == ["a", "b", "cd"]  # another back's draft: apart
    last = Emission("", 0, 0, session=session([1]))
    assert merged([one("a"), last]) == [one("a"), last]  # the reply's end stays its own

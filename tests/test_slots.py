"""Several generations at once: slots chosen by prefix, one batch a step for every session,
prompts evaluated in chunks beside decoding sessions, draft lengths chosen for all the
sessions together, each reply what it would be alone (fake models, virtual clock)."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest

from bench.fake import FakeModel, VirtualClock
from lead.backs.feed import attach
from lead.decode.decoder import Job
from lead.decode.engine import PREFILL_STEPS, Engine, GenRequest, QueueFull
from lead.decode.session import Session
from lead.decode.slots import Seat, choose_seat
from lead.drafts.board import Draft
from lead.policy.cost import CostModel
from shared.model import Part
from shared.sampling import make_draft_rng, make_rng, sample
from shared.wire.protocol import SamplingParams
from tests.conftest import async_wait_until
from tests.test_sampling_exact import Z_0_1_PERCENT, V, chi_square_ok, target_logits

# --- choosing a slot ---


def test_a_prompt_takes_the_free_slot_holding_most_of_it() -> None:
    cached = [(1, 2, 3, 9), (1, 2, 3, 4, 5), (), (7, 7)]
    assert choose_seat([1, 2, 3, 4, 5, 6], cached, [0, 1, 2]) == Seat(1, 5)
    # its own slot is busy: the free one holding least takes it, the prefix is shared in
    assert choose_seat([1, 2, 3, 4, 5, 6], cached, [0, 2, 3]) == Seat(2, 0, 1, 5)
    assert choose_seat([8, 8], cached, [0, 3]) == Seat(3, 0)  # nothing shared: least held
    with pytest.raises(ValueError):
        choose_seat([1], cached, [])


# --- draft lengths for several sessions at once ---


def prices(shape: list[float]) -> CostModel:
    """A cost model at fixed relative prices (b=1 costs 1 s), acceptance unmeasured."""
    cost = CostModel(max_draft=8)
    cost.prices.calibrate({b: x for b, x in enumerate([1.0, *shape], start=1)})
    return cost


def test_one_session_allocates_as_its_own_draft_length() -> None:
    cost = prices([1.05 + 0.05 * i for i in range(15)])  # a GPU: a token more is 5 %
    p_accept = [0.9] * 8
    rates = [(1 + sum(0.9 ** i for i in range(1, k + 1))) / cost.prices.busy_s(k + 1)
             for k in range(9)]  # tokens per second verifying k
    best = max(rates)
    fewest = next(k for k, rate in enumerate(rates) if rate >= 0.99 * best)
    assert fewest > 0 and cost.allocate([p_accept]) == [fewest]


def test_tokens_go_to_the_session_whose_next_is_likeliest() -> None:
    cost = prices([1.05 + 0.05 * i for i in range(15)])
    sure, unsure = [0.95] * 6, [0.3, 0.3, 0.3]
    sure_k, unsure_k = cost.allocate([sure, unsure])
    assert sure_k == 6 and unsure_k <= 1
    assert cost.allocate([unsure, sure]) == [unsure_k, sure_k]  # by odds, not by order


def test_where_drafts_cost_what_they_gain_no_session_gets_any() -> None:
    cost = prices([float(b) for b in range(2, 17)])  # a CPU core: b tokens cost b times one
    assert cost.allocate([[0.8] * 8, [0.8] * 8]) == [0, 0]


def test_a_batch_holds_no_more_than_the_largest_priced_size() -> None:
    cost = prices([1.0] * 8)  # sizes up to 9 priced, all as cheap as one token
    lengths = cost.allocate([[0.99] * 8] * 4)
    assert 4 + sum(lengths) <= 9 and sum(lengths) > 0


def test_a_long_draft_that_would_crush_another_sessions_rate_is_cut() -> None:
    cost = CostModel(max_draft=8)  # the 2-core Xeon's prices: long batches are cheap a token
    cost.prices.calibrate({1: 1.0, 2: 1.53, 3: 1.86, 4: 1.77, 5: 2.35, 6: 2.62, 7: 3.0,
                           8: 3.31, 9: 3.45, 24: 6.2, 32: 6.97, 48: 9.47, 65: 14.18})
    echo = [0.97] * 60  # a file echoed back: lead's own copy, nearly always right
    alone = cost.allocate([echo])[0]
    beside, other = cost.allocate([echo, []])
    assert alone >= 30  # alone, the longest copies pay
    assert 0 < beside < alone / 2 and other == 0  # beside another reply, far shorter ones


def test_a_forced_length_applies_to_every_session() -> None:
    cost = CostModel(max_draft=8, fixed=3)
    assert cost.allocate([[0.1] * 8, [0.5] * 2]) == [3, 2]


# --- the engine ---


def slotted(slots: int = 4, clock: VirtualClock | None = None, **kw: object) -> FakeModel:
    return FakeModel(slots=slots, eos_bias=-100.0, cost_s=(0.001, 0.0001),
                     clock=clock or VirtualClock(), **kw)  # type: ignore[arg-type]


def engine_over(model: FakeModel, **kw: object) -> Engine:
    return Engine(model, clock=model.clock or VirtualClock(), **kw)  # type: ignore[arg-type]


async def reply(engine: Engine, prompt: list[int], max_tokens: int = 30,
                params: SamplingParams | None = None) -> Session:
    req = GenRequest(prompt_ids=prompt, max_tokens=max_tokens,
                     params=params or SamplingParams())
    async for e in engine.generate(req):
        if e.session is not None:
            return e.session
    raise AssertionError("no last emission")


def prompts(n: int, length: int = 12) -> list[list[int]]:
    return [[1 + (i * 7 + j * 3) % 60 for j in range(length)] for i in range(n)]


def run(coro: object) -> object:
    return asyncio.run(asyncio.wait_for(coro, 60))  # type: ignore[arg-type]


@pytest.mark.parametrize("draft_len", [None, 4])
def test_replies_decoded_side_by_side_equal_each_alone(draft_len: int | None) -> None:
    asked = prompts(4)
    alone = [FakeModel(eos_bias=-100.0).greedy_continuation(p, 30) for p in asked]
    model = slotted()
    engine = engine_over(model, parallel=4, draft_len=draft_len, ngram=64, max_draft=8)

    async def body() -> list[Session]:
        return list(await asyncio.gather(*(reply(engine, p) for p in asked)))

    sessions = run(body())
    assert [s.tokens[s.n_prompt:] for s in sessions] == alone  # type: ignore[union-attr]
    # one batch a step for all four: far fewer model calls than four replies' steps
    steps = sum(s.steps for s in sessions)  # type: ignore[union-attr]
    assert len(model.calls) < steps / 2, (len(model.calls), steps)


def test_the_parallel_setting_is_bounded_by_the_models_slots() -> None:
    assert Engine(FakeModel(slots=2), parallel=4).n_slots == 2
    assert Engine(FakeModel(slots=8), parallel=4).n_slots == 4
    assert Engine(FakeModel(), parallel=4).n_slots == 1  # a model of one sequence


def test_a_prompt_arriving_mid_reply_is_evaluated_in_chunks_beside_it() -> None:
    model = slotted(2)
    engine = engine_over(model, parallel=2, max_draft=0)
    engine.cost.prices.calibrate({1: 0.001, 2: 0.0011, 4: 0.0013, 8: 0.0017, 16: 0.0025})
    long_prompt = [1 + (j * 5) % 60 for j in range(400)]
    alone = FakeModel(eos_bias=-100.0).greedy_continuation(long_prompt, 5)

    async def body() -> tuple[Session, Session]:
        first = asyncio.create_task(reply(engine, [3, 4, 5], max_tokens=300))
        await async_wait_until(lambda: engine.session is not None
                               and engine.session.n_generated > 5, what="the first reply")
        second = await reply(engine, long_prompt, max_tokens=5)
        return await first, second

    first, second = run(body())  # type: ignore[misc]
    assert second.tokens[second.n_prompt:] == alone
    chunk = engine.cost.prices.within(PREFILL_STEPS)
    mixed = [n for n in model.calls if 2 < n <= chunk + 2]
    assert len(mixed) >= 400 // chunk  # the prompt went in chunks, a decode step in each
    assert max(model.calls) <= chunk + 2
    assert first.finish_reason == "length" and first.n_generated == 300


def test_a_cancelled_reply_frees_its_slot_for_the_next_at_once() -> None:
    model = slotted(1)
    engine = engine_over(model, parallel=1, max_queue=1)
    ended: list[Session] = []
    engine.on_end = lambda session, now: ended.append(session)

    async def body() -> Session:
        leave = asyncio.Event()

        async def abandon() -> None:
            gen = engine.generate(GenRequest(prompt_ids=[1, 2, 3], max_tokens=10_000))
            async for _ in gen:
                await leave.wait()
                break
            await gen.aclose()  # its reader left

        holder = asyncio.create_task(abandon())
        await async_wait_until(lambda: engine.busy, what="the first reply")
        waiting = asyncio.create_task(reply(engine, [4, 5, 6], max_tokens=5))
        await async_wait_until(lambda: engine.admission.waiting == 1, what="it to wait")
        with pytest.raises(QueueFull):  # one running, one waiting: no place left
            engine.reserve()
        leave.set()
        await holder
        return await waiting

    second = run(body())
    assert second.n_generated == 5  # type: ignore[union-attr]
    cancelled = [s for s in ended if s.finish_reason == "cancelled"]
    assert len(cancelled) == 1 and cancelled[0].n_generated < 10_000


def test_each_conversation_finds_its_own_turns_cached_in_its_slot() -> None:
    model = slotted(2)
    engine = engine_over(model, parallel=2)
    a, b = prompts(2, 40)

    async def body() -> list[Session]:
        first = await asyncio.gather(reply(engine, a, 10), reply(engine, b, 10))
        a2 = first[0].tokens + [5, 6, 7]
        b2 = first[1].tokens + [8, 9]
        return list(await asyncio.gather(reply(engine, a2, 10), reply(engine, b2, 10)))

    second = run(body())
    # each next turn evaluated only what its slot lacked: the new user tokens
    assert [s.prompt_evaluated for s in second] == [3, 2]  # type: ignore[union-attr]


def test_a_prefix_another_slot_holds_is_shared_not_evaluated_again() -> None:
    model = slotted(2)
    engine = engine_over(model, parallel=2)
    system = [1 + (j * 11) % 60 for j in range(200)]

    async def body() -> tuple[Session, Session]:
        first = asyncio.create_task(reply(engine, [*system, 1, 2], max_tokens=200))
        await async_wait_until(lambda: engine.session is not None
                               and engine.session.n_generated > 3, what="the first reply")
        second = await reply(engine, [*system, 3, 4, 5], max_tokens=5)
        return await first, second

    _, second = run(body())  # type: ignore[misc]
    assert second.prompt_evaluated == 2  # 3, 4 (5, its last, is its first step's)
    assert model.slot(1).cached[:200] == system


def test_a_full_house_of_slots_and_queue_refuses_at_once() -> None:
    engine = engine_over(slotted(2), parallel=2, max_queue=1)
    places = [engine.reserve() for _ in range(3)]  # two running, one waiting
    with pytest.raises(QueueFull):
        engine.reserve()
    for place in places:
        place.leave()
    engine.reserve().leave()
    assert engine.metrics.rejected == 1


# --- exactness: several sessions sampled in one batch ---

TRIALS = 6_000


class SaltedTarget(FakeModel):
    """The exactness tests' target over a 6-token vocabulary, salted by the prompt's one
    token so that sessions with other prompts have other distributions."""

    def logits_for(self, context: list[int]) -> np.ndarray:  # type: ignore[override]
        logits = np.full(self.n_vocab, -np.inf, np.float32)
        logits[:V] = target_logits([100 + context[0], *context[1:]])
        return logits


def p_salted(context: list[int]) -> np.ndarray:
    logits = target_logits(context)
    p = np.exp(logits - logits.max())
    return p / p.sum()


def joint(salt: int) -> dict[tuple[int, int], float]:
    first = p_salted([100 + salt])
    return {(a, b): first[a] * p_salted([100 + salt, a])[b] for a in range(V) for b in range(V)}


def test_sessions_sampled_in_one_batch_each_follow_their_own_distribution() -> None:
    """Two sessions with different targets (their prompts salt them) step together, each
    drafting 3 tokens from a far-off q and verifying them in the same model call; each
    one's first two tokens must follow its own joint law."""
    from lead.decode.decoder import Decoder
    from shared.modelthread import ModelThread

    model = SaltedTarget(slots=2, n_vocab=96)
    dec = Decoder(model, CostModel(max_draft=3, fixed=3), ModelThread("t"), VirtualClock())
    params = SamplingParams(temperature=1.0)
    counts: list[Counter[tuple[int, int]]] = [Counter(), Counter()]
    drafts = make_draft_rng(1)
    for trial in range(TRIALS):
        sessions = [[salt] for salt in (1, 2)]
        rngs = [make_rng(trial * 2 + i) for i in range(2)]
        for slot in range(2):
            model.slot(slot).truncate(0)
        while any(len(s) < 3 for s in sessions):
            jobs = [Job(slot, tuple(s), 1, params, rngs[slot], _far_draft(s, drafts))
                    for slot, s in enumerate(sessions) if len(s) < 3]
            for job, result in zip(jobs, dec._step(tuple(jobs), 0).results, strict=True):
                assert result is not None
                sessions[job.slot] += result.verdict.emitted
        for slot, s in enumerate(sessions):
            counts[slot][(s[1], s[2])] += 1
    dec.thread.shutdown()
    for slot, salt in enumerate((1, 2)):
        ok, stat, critical = chi_square_ok(counts[slot], joint(salt), TRIALS)
        print(f"\nsession {slot}: chi2 {stat:.1f} vs critical {critical:.1f}")
        assert ok, f"session {slot}: chi2 {stat:.1f} vs {critical:.1f}"
    assert Z_0_1_PERCENT > 3  # (the same false-alarm rate as tests/test_sampling_exact.py)


def _far_draft(context: list[int], rng: np.random.Generator) -> Draft:
    """Three tokens drawn from a q far from p (exact verification must not care)."""
    from shared.sampling import Dist

    ids, dists = [], []
    for _ in range(3):
        logits = target_logits([100 + context[0], *context[1:], *ids])
        q = np.r_[np.exp(-2 * logits[:4]), 0.0, 0.0]
        q /= q.sum()
        dist = Dist(np.arange(V), q)
        ids.append(sample(dist, rng))
        dists.append(dist)
    return Draft("b", ids, dists)


def test_a_batch_over_slots_gives_each_the_rows_of_its_own_evaluation() -> None:
    model = FakeModel(slots=3)
    alone = FakeModel()
    model.slot(1).evaluate([4, 5, 6], 0)
    parts = [Part(0, (1, 2, 3), 3), Part(1, (7, 8), 2), Part(2, (5,), 0)]
    rows = model.evaluate_parts(parts)
    assert np.array_equal(rows[0], np.stack([alone.logits_for([1]), alone.logits_for([1, 2]),
                                             alone.logits_for([1, 2, 3])]))
    assert np.array_equal(rows[1][1], alone.logits_for([4, 5, 6, 7, 8]))
    assert rows[2].shape == (0, 96)
    assert model.slot(1).cached == [4, 5, 6, 7, 8] and model.slot(2).cached == [5]
    assert model.calls[-1] == 3 + 2 + 1  # one call for all three slots


def test_the_slots_show_what_each_holds_and_whose_drafts_are_on_its_board() -> None:
    engine = engine_over(slotted(slots=2), parallel=2)
    feed = attach(engine)
    seen: list[list[dict[str, object]]] = []

    async def body() -> None:
        req = GenRequest(prompt_ids=prompts(1)[0], max_tokens=20, params=SamplingParams())
        async for e in engine.generate(req):
            session = engine.session
            if e.n_tokens and session is not None and not seen:
                feed.post_draft(session.id, len(session.tokens), [5, 6], None, "b1")
                seen.append(engine.slot_views())

    run(body())
    assert seen[0][1] == {"slot": 1, "state": "idle"}
    assert seen[0][0]["state"] == "decoding" and seen[0][0]["backs"] == ["b1"]
    assert engine.slot_views() == [{"slot": 0, "state": "idle"}, {"slot": 1, "state": "idle"}]

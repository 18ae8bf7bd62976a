"""Penalties and logit bias: their semantics, and that drafts never change what they give."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fake import FakeModel
from lead.decode.verify import verify
from shared.penalties import adjust, adjust_rows
from shared.sampling import distribution, greedy, is_greedy, make_rng, sample
from shared.wire.protocol import SamplingParams
from tests.conftest import InProcessLead, async_wait_until
from tests.test_inprocess import model_worker, new_lead, text_of, with_workers

PENALISED = SamplingParams(frequency_penalty=1.5, presence_penalty=0.5, repeat_penalty=1.4,
                           repeat_last_n=12, logit_bias={5: 2.0, 9: -100.0})
SAMPLED = PENALISED.model_copy(update={"temperature": 0.8, "top_k": 20, "seed": 3})
PROMPT = [12, 13, 14, 12, 13]
Propose = Callable[[list[int]], list[int]]


# --- what each setting does to a row ---

def test_without_penalties_rows_pass_through_uncopied() -> None:
    row = np.arange(8, dtype=np.float32)
    rows = np.stack([row, row])
    assert adjust(row, SamplingParams(), [1, 2, 3], 1) is row
    assert adjust_rows(rows, SamplingParams(), [1, 2], 1, [3]) is rows
    off = SamplingParams(repeat_penalty=1.5, repeat_last_n=0)  # a window of 0 is off
    assert adjust(row, off, [1, 2, 3], 1) is row


def test_logit_bias_is_added() -> None:
    row = np.zeros(6, dtype=np.float32)
    out = adjust(row, SamplingParams(logit_bias={1: 2.5, 4: -100.0}), [], 0)
    assert out.tolist() == [0, 2.5, 0, 0, -100, 0] and row.tolist() == [0] * 6


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits_in_its_window() -> None:
    row = np.array([2.0, -2.0, 3.0, 4.0, 1.0], dtype=np.float32)
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=3)
    # the prompt counts; only the last 3 tokens of the context, each once however often
    out = adjust(row, params, [3, 0, 1, 0], n_prompt=4)
    assert out.tolist() == [1.0, -4.0, 3.0, 4.0, 1.0]
    whole = adjust(row, params.model_copy(update={"repeat_last_n": -1}), [3, 0], 2)
    assert whole.tolist() == [1.0, -2.0, 3.0, 2.0, 1.0]


def test_frequency_and_presence_count_only_the_reply() -> None:
    row = np.zeros(5, dtype=np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0)
    out = adjust(row, params, [2, 2, 2, 1, 1, 3], n_prompt=3)  # prompt [2, 2, 2]
    assert out.tolist() == [0.0, -2.0, 0.0, -1.5, 0.0]


def test_verification_rows_each_follow_their_own_history() -> None:
    rows = np.zeros((3, 4), dtype=np.float32)
    params = SamplingParams(frequency_penalty=1.0)
    out = adjust_rows(rows, params, [0, 1], n_prompt=1, draft=[2, 1])
    assert out.tolist() == [[0, -1, 0, 0], [0, -1, -1, 0], [0, -2, -1, 0]]


# --- drafts change nothing: the pure verifier, against decoding alone ---

def decode_alone(target: FakeModel, context: list[int], n_prompt: int, n: int,
                 params: SamplingParams, rng: np.random.Generator) -> list[int]:
    """The reference: one token at a time, each from its own penalised row."""
    ctx = list(context)
    for _ in range(n):
        row = adjust(target.logits_for(ctx), params, ctx, n_prompt)
        ctx.append(greedy(row) if is_greedy(params) else sample(distribution(row, params), rng))
    return ctx[len(context):]


def speculate(target: FakeModel, n: int, params: SamplingParams, propose: Propose,
              with_history: bool = True) -> tuple[list[int], int, int]:
    """Decode PROMPT as lead does (verify drafts); (output, drafted, accepted)."""
    rng = make_rng(params.seed)
    out: list[int] = []
    drafted = accepted = 0
    while len(out) < n:
        context = PROMPT + out
        draft = propose(context)
        rows = np.stack([target.logits_for(context + draft[:i]) for i in range(len(draft) + 1)])
        history = context if with_history else []
        verdict = verify(draft, rows, params, rng, None, history, len(PROMPT))
        out += verdict.emitted
        drafted, accepted = drafted + len(draft), accepted + len(verdict.accepted)
    return out[:n], drafted, accepted


def reference(target: FakeModel, params: SamplingParams, n: int = 60) -> list[int]:
    return decode_alone(target, PROMPT, len(PROMPT), n, params, make_rng(params.seed))


TARGET = FakeModel(eos_bias=-100.0)


@pytest.mark.parametrize("params", [PENALISED, SAMPLED], ids=["greedy", "sampled"])
def test_the_settings_change_the_output(params: SamplingParams) -> None:
    plain = params.model_copy(update={"frequency_penalty": 0.0, "presence_penalty": 0.0,
                                      "repeat_penalty": 1.0, "logit_bias": {}})
    assert reference(TARGET, params) != reference(TARGET, plain)
    assert 9 not in reference(TARGET, params)  # banned by its bias of -100


@pytest.mark.parametrize("params", [PENALISED, SAMPLED], ids=["greedy", "sampled"])
def test_correct_drafts_are_all_accepted_and_change_nothing(params: SamplingParams) -> None:
    alone = reference(TARGET, params, 80)
    oracle = lambda ctx: alone[len(ctx) - len(PROMPT):][:4]  # noqa: E731
    out, drafted, accepted = speculate(TARGET, 60, params, oracle)
    assert out == alone[:60]
    assert accepted == drafted > 40  # each row was penalised for its own history


@pytest.mark.parametrize("params", [PENALISED, SAMPLED], ids=["greedy", "sampled"])
def test_partly_wrong_drafts_change_nothing(params: SamplingParams) -> None:
    alone = reference(TARGET, params, 80)

    def partly_wrong(ctx: list[int]) -> list[int]:
        good = alone[len(ctx) - len(PROMPT):][:4]
        return good[:2] + [(t + 1) % TARGET.n_vocab for t in good[2:]]

    out, _, accepted = speculate(TARGET, 60, params, partly_wrong)
    assert out == alone[:60] and accepted > 0


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sampled=st.booleans())
def test_random_drafts_change_nothing(seed: int, sampled: bool) -> None:
    params = SAMPLED if sampled else PENALISED
    rng = np.random.default_rng(seed)
    alone = reference(TARGET, params, 80)

    def noisy(ctx: list[int]) -> list[int]:
        truth = alone[len(ctx) - len(PROMPT):][: int(rng.integers(0, 6))]
        noise = rng.integers(0, TARGET.n_vocab, size=len(truth)).tolist()
        flip = rng.random(len(truth)) < 0.3
        return [x if f else t for t, x, f in zip(truth, noise, flip, strict=True)]

    assert speculate(TARGET, 40, params, noisy)[0] == alone[:40]


def test_a_verifier_blind_to_the_history_would_be_caught() -> None:
    alone = reference(TARGET, PENALISED, 80)
    oracle = lambda ctx: alone[len(ctx) - len(PROMPT):][:4]  # noqa: E731
    assert speculate(TARGET, 60, PENALISED, oracle, with_history=False)[0] != alone[:60]


# --- through lead's API, with a back that drafts under the same penalties ---

async def ask(transport: httpx.AsyncBaseTransport, **body: object) -> dict:
    async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
        r = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hello there"}], **body})
        assert r.status_code == 200, r.text
        return r.json()


def test_a_back_drafting_with_penalties_changes_no_reply_and_keeps_its_acceptance() -> None:
    body = {"repeat_penalty": 1.3, "repeat_last_n": 16, "logit_bias": {"5": 4.0, "9": -100}}

    async def run() -> None:
        ref_app, _ = new_lead()
        alone = await ask(httpx.ASGITransport(app=ref_app), max_tokens=80, **body)
        plain = await ask(httpx.ASGITransport(app=new_lead()[0]), max_tokens=80)
        assert text_of(alone) != text_of(plain)  # the settings matter here
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=1.0)  # the draft model is the target

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport, max_tokens=80, **body)
                assert text_of(reply) == text_of(alone)
                usage = reply["usage"]
                # drafted under the same penalties, a perfect draft model is always right
                assert usage["drafted_tokens"] > 10
                assert usage["accepted_tokens"] == usage["drafted_tokens"], usage

            await with_workers([worker], check)
    asyncio.run(asyncio.wait_for(run(), 60))


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_frequency_and_presence_with_a_back_change_no_reply(temperature: float) -> None:
    body = {"frequency_penalty": 1.2, "presence_penalty": 0.6, "temperature": temperature,
            "seed": 11}

    async def run() -> None:
        alone = await ask(httpx.ASGITransport(app=new_lead()[0]), max_tokens=80, **body)
        app, _ = new_lead()
        async with InProcessLead(app) as transport:
            worker = model_worker(transport, agree=0.8)

            async def check() -> None:
                await async_wait_until(lambda: worker.version >= 0, what="back handshake")
                reply = await ask(transport, max_tokens=80, **body)
                assert reply["usage"]["drafted_tokens"] > 0
                if temperature == 0.0:  # sampled replies match in law only (rejection sampling)
                    assert text_of(reply) == text_of(alone)

            await with_workers([worker], check)
    asyncio.run(asyncio.wait_for(run(), 60))

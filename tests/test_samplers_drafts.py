"""llama-server's DRY, XTC, mirostat (1.0, 2.0), typical and min_keep: drafts never change
what they emit. Each setting decodes a scripted fake target one token at a time, the
reference (its draws and mirostat's mu threaded by hand); lead's verifier then decodes it
again with drafts all right, all wrong and random, and must emit the same tokens, seed
for seed. A verifier that drops mu between steps, or draws XTC's uniform out of turn,
is caught."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fake import FakeModel, VirtualClock
from lead.decode.engine import Engine
from lead.decode.session import GenRequest, Session
from lead.decode.verify import verify
from shared.penalties import adjust
from shared.sampling import (
    distribution,
    drops_best,
    greedy,
    is_greedy,
    make_rng,
    mirostat_mu,
    sample,
    xtc_draws,
)
from shared.wire.protocol import SamplingParams

TARGET = FakeModel(eos_bias=-100.0)
LOOP = [12, 13, 14, *TARGET.greedy_continuation([12, 13, 14], 9)]
PROMPT = LOOP + LOOP[:7]  # the target would repeat it: DRY has work from the start
SAMPLED = {"temperature": 0.9, "seed": 5}
SETTINGS = {
    "dry": SamplingParams(**SAMPLED, dry_multiplier=1.5, dry_base=1.5, dry_allowed_length=1,
                          dry_restarts={33: ((),)}),  # "\n" breaks a repeat
    "dry greedy": SamplingParams(dry_multiplier=2.0, dry_allowed_length=1,
                                 dry_penalty_last_n=24),
    "xtc": SamplingParams(**SAMPLED, xtc_probability=0.6, xtc_threshold=0.05),
    "xtc greedy": SamplingParams(seed=5, xtc_probability=0.6, xtc_threshold=0.05),
    "typical": SamplingParams(**SAMPLED, typical_p=0.6, min_keep=2),
    "typical greedy": SamplingParams(typical_p=0.3),
    "min_keep": SamplingParams(**SAMPLED, top_p=0.3, min_p=0.5, min_keep=4),
    "mirostat": SamplingParams(**SAMPLED, mirostat=1, mirostat_tau=3.0, mirostat_eta=0.3),
    "mirostat 2": SamplingParams(**SAMPLED, mirostat=2, mirostat_tau=3.0, mirostat_eta=0.3),
    "all": SamplingParams(**SAMPLED, top_k=40, typical_p=0.9, top_p=0.95, min_p=0.02,
                          xtc_probability=0.5, xtc_threshold=0.08, dry_multiplier=0.8,
                          repeat_penalty=1.1, min_keep=2),
}
Propose = Callable[[list[int]], list[int]]


def decode_alone(params: SamplingParams, n: int, seed: int | None) -> list[int]:
    """The reference: one token a position, each drawn as llama-server's chain would."""
    rng, ctx, mu = make_rng(seed), list(PROMPT), None
    for _ in range(n):
        row = adjust(TARGET.logits_for(ctx), params, ctx, len(PROMPT))
        coin = rng.random() if xtc_draws(params) else None  # XTC's uniform, then the token's
        dist = distribution(row, params, coin=coin, mu=mu)
        if is_greedy(params):
            token = int(dist.token_ids[0]) if drops_best(params) else greedy(row)
        else:
            token = sample(dist, rng)
            mu = mirostat_mu(mu, params, dist.prob_of(token)) if params.mirostat else None
        ctx.append(token)
    return ctx[len(PROMPT):]


def speculate(params: SamplingParams, n: int, seed: int, propose: Propose,
              keep_mu: bool = True, history: bool = True) -> tuple[list[int], int]:
    """Decode as lead does, verifying drafts; (output, tokens accepted). `keep_mu`,
    `history`: False for a verifier that forgets mu, or the context, between steps."""
    rng, out, mu, accepted = make_rng(seed), [], None, 0
    while len(out) < n:
        ctx = PROMPT + out
        draft = propose(ctx)
        rows = np.stack([TARGET.logits_for(ctx + draft[:i]) for i in range(len(draft) + 1)])
        verdict = verify(draft, rows, params, rng, None, ctx if history else out, len(PROMPT),
                         None, mu)
        out += verdict.emitted
        mu, accepted = verdict.mu if keep_mu else None, accepted + len(verdict.accepted)
    return out[:n], accepted


CASES = [(name, seed) for name in SETTINGS for seed in (1, 2, 3)]


@pytest.mark.parametrize(("name", "seed"), CASES)
def test_right_drafts_are_all_accepted_and_change_nothing(name: str, seed: int) -> None:
    params = SETTINGS[name]
    alone = decode_alone(params, 60, seed)
    oracle = lambda ctx: alone[len(ctx) - len(PROMPT):][:5]  # noqa: E731
    out, accepted = speculate(params, 40, seed, oracle)
    assert out == alone[:40]
    assert accepted >= 30  # each row's samplers were those of its own position


@pytest.mark.parametrize(("name", "seed"), CASES)
def test_wrong_drafts_change_nothing(name: str, seed: int) -> None:
    params = SETTINGS[name]
    alone = decode_alone(params, 60, seed)

    def wrong(ctx: list[int]) -> list[int]:
        return [(t + 1) % TARGET.n_vocab for t in alone[len(ctx) - len(PROMPT):][:4]]

    assert speculate(params, 40, seed, wrong)[0] == alone[:40]


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SETTINGS)), seed=st.integers(0, 2**32 - 1))
def test_random_drafts_change_nothing(name: str, seed: int) -> None:
    params, noise = SETTINGS[name], np.random.default_rng(seed)
    alone = decode_alone(params, 50, seed)

    def noisy(ctx: list[int]) -> list[int]:
        truth = alone[len(ctx) - len(PROMPT):][: int(noise.integers(0, 7))]
        flip = noise.random(len(truth)) < 0.3
        other = noise.integers(0, TARGET.n_vocab, size=len(truth))
        return [int(o) if f else t for t, o, f in zip(truth, other, flip, strict=True)]

    assert speculate(params, 35, seed, noisy)[0] == alone[:35]


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_each_setting_changes_the_output(name: str) -> None:
    """The samplers act here: the tests above could not pass by their doing nothing."""
    params = SETTINGS[name]
    off = SamplingParams(temperature=params.temperature, seed=params.seed)
    assert decode_alone(params, 40, 1) != decode_alone(off, 40, 1)


@pytest.mark.parametrize("name", ["mirostat", "mirostat 2"])
def test_a_verifier_that_lost_mu_between_steps_would_be_caught(name: str) -> None:
    params = SETTINGS[name]
    alone = decode_alone(params, 60, 1)
    oracle = lambda ctx: alone[len(ctx) - len(PROMPT):][:3]  # noqa: E731
    assert speculate(params, 40, 1, oracle, keep_mu=False)[0] != alone[:40]


@pytest.mark.parametrize("name", ["dry", "dry greedy"])
def test_a_verifier_blind_to_the_prompt_would_be_caught(name: str) -> None:
    params = SETTINGS[name]
    alone = decode_alone(params, 60, 1)
    oracle = lambda ctx: alone[len(ctx) - len(PROMPT):][:3]  # noqa: E731
    assert speculate(params, 40, 1, oracle, history=False)[0] != alone[:40]


def test_mu_follows_the_accepted_tokens_and_not_the_rejected() -> None:
    """One step's mu is the one decoding alone holds after the tokens it emitted: the
    accepted draft tokens and the correction, never the draft tokens past it."""
    params = SETTINGS["mirostat 2"]
    alone = decode_alone(params, 12, 4)
    draft = alone[:3] + [(alone[3] + 1) % TARGET.n_vocab, alone[4]]
    rows = np.stack([TARGET.logits_for(PROMPT + draft[:i]) for i in range(len(draft) + 1)])
    verdict = verify(draft, rows, params, make_rng(4), None, PROMPT, len(PROMPT))
    assert verdict.emitted == alone[:4]
    assert verdict.mu == pytest.approx(mu_alone(params, alone[:4], 4))


def mu_alone(params: SamplingParams, tokens: list[int], seed: int) -> float | None:
    rng, ctx, mu = make_rng(seed), list(PROMPT), None
    for token in tokens:
        dist = distribution(TARGET.logits_for(ctx), params, mu=mu)
        assert sample(dist, rng) == token
        mu, ctx = mirostat_mu(mu, params, dist.prob_of(token)), [*ctx, token]
    return mu


# --- lead's engine, its own drafts on: the state goes from step to step ---

class Priced(FakeModel):
    """The target on a virtual clock: each call priced at its nominal cost, not slept."""

    def __init__(self) -> None:
        super().__init__(eos_bias=-100.0, clock=VirtualClock(), cost_s=(0.01, 0.001))

    def _spend(self, n_tokens: int, abort: object, started: float) -> None:  # type: ignore[override]
        assert self.clock is not None
        self.clock.advance(self.cost_of(n_tokens))


def engine_reply(params: SamplingParams, ngram: int) -> tuple[list[int], Session]:
    model = Priced()
    engine = Engine(model, max_draft=8, ngram=ngram, clock=model.clock)  # type: ignore[arg-type]
    engine.cost.fix_prices([1.0])  # a batch costs about a token: lead drafts where it can

    async def run() -> None:
        async for _ in engine.generate(GenRequest(list(PROMPT), 40, params)):
            pass
    asyncio.run(run())
    assert engine.session is not None
    return engine.session.tokens[len(PROMPT):], engine.session


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_the_engine_with_its_own_drafts_emits_decoding_s_alone(name: str) -> None:
    """Mirostat's mu, the draws and DRY's history kept from step to step (the session),
    whether lead drafts or not."""
    params = SETTINGS[name]
    alone = decode_alone(params, 40, params.seed)
    tokens, session = engine_reply(params, 64)
    assert tokens == alone
    assert session.drafted > 0
    assert engine_reply(params, 0)[0] == alone

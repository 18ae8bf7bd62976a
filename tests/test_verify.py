"""The pure verifier: for any drafts, greedy output equals the target's own greedy output."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fake import FakeModel
from lead.decode.verify import verify
from shared.wire.protocol import SamplingParams

GREEDY = SamplingParams()


def speculate(target: FakeModel, prompt: list[int], n: int, propose) -> list[int]:
    """Drive verify() as lead does: evaluate last token + draft, keep the verdict."""
    out: list[int] = []
    rng = np.random.default_rng(0)
    while len(out) < n:
        context = prompt + out
        draft = propose(context)
        rows = np.stack([target.logits_for(context + draft[:i]) for i in range(len(draft) + 1)])
        verdict = verify(draft, rows, GREEDY, rng)
        assert verdict.accepted == draft[: len(verdict.accepted)], "accepted must be a prefix"
        out += verdict.emitted
        if 0 in verdict.emitted:
            out = out[: out.index(0) + 1]
            break
    return out[:n]


def test_correct_drafts_are_all_accepted_and_output_unchanged() -> None:
    target = FakeModel()
    prompt = [5, 6, 7]
    alone = target.greedy_continuation(prompt, 40)
    oracle = lambda ctx: target.greedy_continuation(ctx, 4)  # noqa: E731
    assert speculate(target, prompt, 40, oracle) == alone


def test_wrong_drafts_never_change_output() -> None:
    target = FakeModel()
    prompt = [9, 9]
    alone = target.greedy_continuation(prompt, 40)
    wrong = lambda ctx: [(t + 1) % target.n_vocab for t in target.greedy_continuation(ctx, 3)]  # noqa: E731
    assert speculate(target, prompt, 40, wrong) == alone


def test_partly_wrong_draft_accepts_exactly_the_agreeing_prefix() -> None:
    target = FakeModel()
    prompt = [3, 1, 4]
    good = target.greedy_continuation(prompt, 5)
    draft = good[:2] + [(good[2] + 1) % target.n_vocab] + good[3:]
    rows = np.stack([target.logits_for(prompt + draft[:i]) for i in range(len(draft) + 1)])
    verdict = verify(draft, rows, GREEDY, np.random.default_rng(0))
    assert verdict.accepted == good[:2]
    assert verdict.next_token == good[2]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lengths=st.lists(st.integers(0, 6), min_size=1,
                                                        max_size=30))
def test_random_and_adversarial_drafts_never_change_output(seed: int, lengths: list[int]) -> None:
    target = FakeModel()
    prompt = [1, 2, 3]
    alone = target.greedy_continuation(prompt, 30)
    rng = np.random.default_rng(seed)
    calls = iter(lengths * 10)

    def propose(ctx: list[int]) -> list[int]:
        k = next(calls, 0)
        truth = target.greedy_continuation(ctx, k)
        noise = rng.integers(0, target.n_vocab, size=len(truth)).tolist()
        flip = rng.random(len(truth)) < 0.3  # mostly right, sometimes not: the hard case
        return [n if f else t for t, n, f in zip(truth, noise, flip, strict=True)]

    assert speculate(target, prompt, 30, propose) == alone


def test_empty_draft_is_plain_decoding() -> None:
    target = FakeModel()
    rows = target.logits_for([1, 2])[None, :]
    verdict = verify([], rows, GREEDY, np.random.default_rng(0))
    assert verdict.accepted == [] and verdict.next_token == int(np.argmax(rows[0]))

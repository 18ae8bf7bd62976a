"""Speculative sampling is exact: emitted tokens follow the target's distribution p.

A small-vocabulary fake target p(.|context) and draft distributions q that are close
to p, far from p, and disjoint from p. Each trial runs the real verifier step by step
(draft 3 tokens from q, verify, append what it emits) until two tokens exist; the
joint law of (x1, x2) must be p(x1) p(x2|x1). Chi-square test, 12,000 trials, false-
alarm rate 0.1 % per check (seeds are fixed, so a run is reproducible). A deliberately
wrong verifier must be caught by the same check: the test has power.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from bench.fake import FakeGrammar
from lead.decode.verify import Verdict, verify
from lead.drafts.board import Candidate, DraftBoard, post_candidates
from shared.branch import Branch
from shared.penalties import adjust
from shared.sampling import Dist, distribution, make_draft_rng, make_rng, sample
from shared.wire.protocol import SamplingParams

V = 6  # tokens 0-3 can be emitted by the target; 4-5 only by the disjoint draft
PARAMS = SamplingParams(temperature=1.0)
TRIALS = 12_000
Z_0_1_PERCENT = 3.090  # one-sided normal quantile for a 0.1 % false-alarm rate


def target_logits(context: list[int]) -> np.ndarray:
    seed = int.from_bytes(hashlib.blake2b(repr(context).encode(), digest_size=8).digest())
    logits = np.random.default_rng(seed).normal(0.0, 1.2, V)
    logits[4:] = -np.inf  # p is zero there
    return logits


def p_of(context: list[int]) -> np.ndarray:
    return distribution(target_logits(context), PARAMS).dense(V)


def _dist(probs: np.ndarray) -> Dist:
    keep = np.nonzero(probs > 0)[0]
    return Dist(keep, probs[keep] / probs[keep].sum())


DRAFTS: dict[str, Callable[[list[int]], Dist]] = {
    "close": lambda ctx: _dist(0.85 * p_of(ctx) + 0.15 * np.r_[np.full(4, 0.25), 0, 0]),
    "far": lambda ctx: _dist(np.r_[np.exp(-2 * target_logits(ctx)[:4]), 0, 0]),
    "disjoint": lambda ctx: _dist(np.r_[0, 0, 0, 0, 0.5, 0.5]),
}


def draft_three(q_of: Callable[[list[int]], Dist], context: list[int],
                rng: np.random.Generator) -> tuple[list[int], list[Dist]]:
    """Sample 3 draft tokens from q, each given the context and the ones before it."""
    draft: list[int] = []
    dists: list[Dist] = []
    for _ in range(3):
        q = q_of(context + draft)
        draft.append(sample(q, rng))
        dists.append(q)
    return draft, dists


def speculative_pair(q_of: Callable[[list[int]], Dist], rng: np.random.Generator,
                     verifier: Callable[..., Verdict] = verify) -> tuple[int, int]:
    out: list[int] = []
    while len(out) < 2:
        draft, dists = draft_three(q_of, out, rng)
        rows = np.stack([target_logits(out + draft[:i]) for i in range(4)])
        out += verifier(draft, rows, PARAMS, rng, dists).emitted
    return out[0], out[1]


def chi_square_ok(counts: Counter, expected: dict[tuple[int, int], float], n: int
                  ) -> tuple[bool, float, float]:
    cells = [c for c, e in expected.items() if e > 0]
    if any(counts[c] for c in counts if expected.get(c, 0) == 0):
        return False, math.inf, 0.0  # an impossible pair was emitted
    stat = sum((counts[c] - n * expected[c]) ** 2 / (n * expected[c]) for c in cells)
    df = len(cells) - 1
    # Wilson-Hilferty approximation of the chi-square quantile
    critical = df * (1 - 2 / (9 * df) + Z_0_1_PERCENT * math.sqrt(2 / (9 * df))) ** 3
    return stat <= critical, stat, critical


def exact_joint() -> dict[tuple[int, int], float]:
    first = p_of([])
    return {(a, b): first[a] * p_of([a])[b] for a in range(V) for b in range(V)}


@pytest.mark.parametrize("draft", list(DRAFTS))
def test_emitted_tokens_follow_target_distribution(draft: str) -> None:
    rng = np.random.default_rng(20261122)
    counts = Counter(speculative_pair(DRAFTS[draft], rng) for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    print(f"\n{draft}: chi2 {stat:.1f} vs critical {critical:.1f} ({TRIALS} trials)")
    assert ok, f"{draft}: chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_catches_a_biased_verifier() -> None:
    def accept_everything(draft, rows, params, rng, dists):  # type: ignore[no-untyped-def]
        return Verdict(list(draft), sample(distribution(rows[-1], params), rng))

    rng = np.random.default_rng(7)
    counts = Counter(speculative_pair(DRAFTS["close"], rng, accept_everything)
                     for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    assert not ok, f"a wrong verifier passed: chi2 {stat:.1f} <= {critical:.1f}"


def seeded_pair(q_of: Callable[[list[int]], Dist], seed: int,
                back_rng: Callable[[int], np.random.Generator]) -> tuple[int, int]:
    """One seeded request as lead and back run it: each side makes its generator from
    the request's seed (lead with make_rng, the back with `back_rng`)."""
    lead_rng, draft_rng = make_rng(seed), back_rng(seed)
    out: list[int] = []
    while len(out) < 2:
        draft, dists = draft_three(q_of, out, draft_rng)
        rows = np.stack([target_logits(out + draft[:i]) for i in range(4)])
        out += verify(draft, rows, PARAMS, lead_rng, dists).emitted
    return out[0], out[1]


@pytest.mark.parametrize(("back_rng", "exact"), [(make_draft_rng, True), (make_rng, False)])
def test_seeded_requests_stay_exact_only_with_the_backs_own_stream(
        back_rng: Callable[[int], np.random.Generator], exact: bool) -> None:
    # Drafting from lead's own stream reuses each acceptance uniform as the draw that
    # chose the token: the check must catch that, and pass the back's real generator.
    counts = Counter(seeded_pair(DRAFTS["far"], seed, back_rng) for seed in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    assert ok == exact, f"{back_rng.__name__}: chi2 {stat:.1f} vs critical {critical:.1f}"


def test_sample_and_compare_without_probabilities_is_exact_too() -> None:
    rng = np.random.default_rng(99)

    def no_dists(draft, rows, params, rng, dists):  # type: ignore[no-untyped-def]
        return verify(draft, rows, params, rng, None)

    counts = Counter(speculative_pair(DRAFTS["far"], rng, no_dists) for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    assert ok, f"chi-square {stat:.1f} > {critical:.1f}"


def test_rejection_sampling_accepts_more_than_sample_and_compare() -> None:
    rng = np.random.default_rng(3)
    q_of = DRAFTS["close"]
    accepted = {"rejection": 0, "compare": 0}
    for _ in range(3000):
        draft, dists = draft_three(q_of, [], rng)
        rows = np.stack([target_logits(draft[:i]) for i in range(4)])
        accepted["rejection"] += len(verify(draft, rows, PARAMS, rng, dists).accepted)
        accepted["compare"] += len(verify(draft, rows, PARAMS, rng, None).accepted)
    assert accepted["rejection"] > 1.2 * accepted["compare"], accepted


def test_seeded_verification_is_reproducible() -> None:
    rows = np.stack([target_logits([1] * i) for i in range(4)])
    dists = [DRAFTS["far"]([])] * 3
    runs = [verify([0, 1, 2], rows, PARAMS, np.random.default_rng(5), dists) for _ in range(2)]
    assert runs[0] == runs[1]


def test_low_temperature_approaches_greedy() -> None:
    logits = np.array([0.0, 2.0, 1.99, -1.0], dtype=np.float32)
    cold = distribution(logits, SamplingParams(temperature=1e-4))
    assert cold.token_ids[np.argmax(cold.probs)] == 1 and cold.probs.max() > 0.999
    assert np.isfinite(cold.probs).all()


# --- with penalties and bias: p is the adjusted distribution, and stays exact ---

PENALISED = SamplingParams(temperature=1.0, frequency_penalty=1.5, presence_penalty=0.5,
                           repeat_penalty=2.0, logit_bias={1: 1.0})
PROMPT = [2, 3]  # in the repeat window; only the reply counts for frequency and presence


def p_penalised(out: list[int], params: SamplingParams = PENALISED) -> np.ndarray:
    context = PROMPT + out
    row = adjust(target_logits(context), params, context, len(PROMPT))
    return distribution(row, params).dense(V)


def penalised_joint() -> dict[tuple[int, int], float]:
    first = p_penalised([])
    return {(a, b): first[a] * p_penalised([a])[b] for a in range(V) for b in range(V)}


def penalised_pair(q_of: Callable[[list[int]], Dist], rng: np.random.Generator,
                   params: SamplingParams) -> tuple[int, int]:
    out: list[int] = []
    while len(out) < 2:
        draft, dists = draft_three(q_of, out, rng)
        context = PROMPT + out
        rows = np.stack([target_logits(context + draft[:i]) for i in range(4)])
        out += verify(draft, rows, params, rng, dists, context, len(PROMPT)).emitted
    return out[0], out[1]


PENALISED_DRAFTS: dict[str, Callable[[list[int]], Dist]] = {
    "close": lambda out: _dist(0.85 * p_penalised(out) + 0.15 * np.r_[np.full(4, 0.25), 0, 0]),
    "unpenalised": lambda out: DRAFTS["close"](PROMPT + out),  # a back blind to penalties
}


@pytest.mark.parametrize("draft", list(PENALISED_DRAFTS))
def test_with_penalties_emitted_tokens_follow_the_adjusted_distribution(draft: str) -> None:
    rng = np.random.default_rng(20261124)
    counts = Counter(penalised_pair(PENALISED_DRAFTS[draft], rng, PENALISED)
                     for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, penalised_joint(), TRIALS)
    assert ok, f"{draft}: chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_catches_a_verifier_that_ignores_penalties() -> None:
    rng = np.random.default_rng(8)
    plain = SamplingParams(temperature=1.0)
    counts = Counter(penalised_pair(PENALISED_DRAFTS["close"], rng, plain)
                     for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, penalised_joint(), TRIALS)
    assert not ok, f"penalties ignored, yet chi2 {stat:.1f} <= {critical:.1f}"


# --- with a grammar: p is the masked distribution (penalties, mask, then truncation) ---

GRAMMAR = FakeGrammar.parse('root ::= "12" | "13" | "21" | "23" | "25" | "31" | "32" | "35"',
                            lambda text: [int(c) for c in text], V)  # token 0 ends replies


def p_masked(out: list[int]) -> np.ndarray:
    return distribution(GRAMMAR.advanced(out).mask(target_logits(out)), PARAMS).dense(V)


def masked_joint() -> dict[tuple[int, int], float]:
    first = p_masked([])
    return {(a, b): first[a] * p_masked([a])[b] if first[a] else 0.0
            for a in range(V) for b in range(V)}


def grammar_pair(q_of: Callable[[list[int]], Dist], rng: np.random.Generator,
                 dists: bool = True, constrained: bool = True) -> tuple[int, int]:
    """Lead's steps, the grammar's state carried from each verdict to the next."""
    out: list[int] = []
    state = GRAMMAR if constrained else None
    while len(out) < 2:
        draft, q = draft_three(q_of, out, rng)
        rows = np.stack([target_logits(out + draft[:i]) for i in range(4)])
        verdict = verify(draft, rows, PARAMS, rng, q if dists else None, constraint=state)
        state = verdict.constraint
        out += verdict.emitted
    return out[0], out[1]


def _masked_close(out: list[int]) -> Dist:
    allowed = np.isfinite(GRAMMAR.advanced(out).mask(np.zeros(V)))
    return _dist(0.85 * p_masked(out) + 0.15 * allowed / allowed.sum())


GRAMMAR_DRAFTS: dict[str, tuple[Callable[[list[int]], Dist], bool]] = {
    "masked, rejection": (_masked_close, True),  # a back drafting under the grammar
    "blind, rejection": (DRAFTS["close"], True),  # one drafting without it
    "far, rejection": (DRAFTS["far"], True),
    "blind, sample-and-compare": (DRAFTS["close"], False),
}


@pytest.mark.parametrize("draft", list(GRAMMAR_DRAFTS))
def test_with_a_grammar_emitted_tokens_follow_the_masked_distribution(draft: str) -> None:
    q_of, dists = GRAMMAR_DRAFTS[draft]
    rng = np.random.default_rng(20261125)
    counts = Counter(grammar_pair(q_of, rng, dists) for _ in range(TRIALS))
    expected = masked_joint()
    assert sum(1 for e in expected.values() if e > 0) >= 5  # the law has room to be wrong
    ok, stat, critical = chi_square_ok(counts, expected, TRIALS)
    assert ok, f"{draft}: chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_catches_a_verifier_that_ignores_the_grammar() -> None:
    rng = np.random.default_rng(9)
    counts = Counter(grammar_pair(_masked_close, rng, constrained=False)
                     for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, masked_joint(), TRIALS)
    assert not ok, f"grammar ignored, yet chi2 {stat:.1f} <= {critical:.1f}"


# --- with branches: after a rejection, the branch rooted at lead's correction is the draft ---


def draft_n(q_of: Callable[[list[int]], Dist], context: list[int], rng: np.random.Generator,
            n: int) -> tuple[list[int], list[Dist]]:
    draft: list[int] = []
    dists: list[Dist] = []
    for _ in range(n):
        q = q_of(context + draft)
        draft.append(sample(q, rng))
        dists.append(q)
    return draft, dists


def tree_post(q_of: Callable[[list[int]], Dist], context: list[int], rng: np.random.Generator,
              width: int = 2) -> list[Candidate]:
    """A back's post: a main chain of 3 sampled from q; at each of its positions, branches
    rooted at q's `width` next likeliest tokens, each followed by 2 tokens sampled from q."""
    main, dists = draft_three(q_of, context, rng)
    branches = []
    for at, q in enumerate(dists):
        likeliest = q.token_ids[np.argsort(-q.probs, kind="stable")]
        for root in [int(t) for t in likeliest if t != main[at]][:width]:
            rest, rest_dists = draft_n(q_of, context + main[:at] + [root], rng, 2)
            branches.append(Branch(at, (root, *rest), (q, *rest_dists)))
    return post_candidates("back", len(context), main, dists, branches)


def memo(f: Callable[[list[int]], np.ndarray | Dist]) -> Callable[[list[int]], Any]:
    """`f` of a context, computed once per context (a tree asks for many)."""
    cached = functools.cache(lambda context: f(list(context)))
    return lambda context: cached(tuple(context))


rows_of = memo(target_logits)


def branching_pair(q_of: Callable[[list[int]], Dist], rng: np.random.Generator,
                   used: Counter, eager: bool = False) -> tuple[int, int]:
    """Lead's steps over the board: a new post only when no candidate agrees, so a step
    after a rejection at the first token verifies the branch rooted at its correction.
    `eager`: a wrong board that offers branches before lead emits their roots."""
    board, out = DraftBoard(), []
    while len(out) < 2:
        draft = board.best(out, 3)
        if draft is None:
            main, *branches = tree_post(q_of, out, rng)
            if eager:  # roots at the first token, offered at once, reaching furthest
                branches = [replace(b, root=None, token_ids=(*b.token_ids, 1),
                                    dists=(*(b.dists or ()), q_of([])))
                            for b in branches if b.root == 0]
            board.post(out, main, branches)
            draft = board.best(out, 3)
        assert draft is not None
        used[draft.branch] += 1
        rows = np.stack([rows_of(out + draft.token_ids[:i])
                         for i in range(len(draft.token_ids) + 1)])
        out += verify(draft.token_ids, rows, PARAMS, rng, draft.dists).emitted
    return out[0], out[1]


@pytest.mark.parametrize("draft", ["close", "far"])
def test_with_branches_emitted_tokens_follow_target_distribution(draft: str) -> None:
    rng = np.random.default_rng(20261126)
    used: Counter = Counter()
    q_of = memo(DRAFTS[draft])
    counts = Counter(branching_pair(q_of, rng, used) for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    print(f"\n{draft}: chi2 {stat:.1f} vs critical {critical:.1f}, {used[True]} steps "
          "verified a branch")
    assert used[True] > TRIALS // 20, used  # the law is checked with branches in it
    assert ok, f"{draft}: chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_catches_a_board_that_verifies_a_branchs_root() -> None:
    # A root is q's runner-up, chosen, not sampled: verified as if drawn from q it biases
    # the output, which is why the board waits for lead to emit it.
    rng = np.random.default_rng(10)
    used: Counter = Counter()
    q_of = memo(DRAFTS["close"])
    counts = Counter(branching_pair(q_of, rng, used, eager=True)
                     for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    assert not ok, f"roots verified as drafts, yet chi2 {stat:.1f} <= {critical:.1f}"

"""The benchmark's bounds and figures: pure functions of costs, acceptance and replies."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from bench.ideal import (
    async_ideal,
    band_p_accept,
    best_length,
    branch_ideal,
    expected_tokens,
    free_draft_bound,
    padded,
    per_token_ideal,
    pooled_speedup,
    replayed_ideal,
    simulate,
)
from bench.report import per_prompt, summarise
from bench.runs import Result

Cost = Callable[[int], float]


def flat(b: int) -> float:
    return 0.030 + 0.0005 * b  # GPU-like: verifying more tokens costs almost nothing


def linear(b: int) -> float:
    return 0.1 * b  # compute-bound: b tokens cost b single steps


def test_expected_tokens_geometric() -> None:
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_free_draft_bound_is_one_where_verify_is_linear() -> None:
    assert free_draft_bound(linear, 0.9, 8) == (1.0, 0)
    speedup, k = free_draft_bound(flat, 0.8, 8)
    assert speedup == pytest.approx(expected_tokens(0.8, k) * flat(1) / flat(k + 1))
    assert speedup > 3


def test_async_ideal_with_an_instant_draft_reaches_the_free_draft_bound() -> None:
    free, _ = free_draft_bound(flat, 0.8, 8)
    ideal, _ = async_ideal(flat, 0.8, draft_s=0.0, max_draft=8, n_tokens=4000)
    assert ideal == pytest.approx(free, rel=0.05)


def test_async_ideal_pays_for_restarting_after_rejections() -> None:
    free, _ = free_draft_bound(flat, 0.8, 8)
    fast, _ = async_ideal(flat, 0.8, draft_s=0.003, max_draft=8)
    slow, _ = async_ideal(flat, 0.8, draft_s=0.015, max_draft=8)
    assert 1.0 < slow < fast < free


def test_async_ideal_never_below_plain_decoding() -> None:
    assert async_ideal(flat, 0.0, draft_s=0.003, max_draft=8) == (1.0, 0)
    assert async_ideal(linear, 0.9, draft_s=0.003, max_draft=8) == (1.0, 0)
    assert async_ideal(flat, 0.9, draft_s=10.0, max_draft=8)[0] == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize(("cost", "alpha", "draft_s"), [
    (flat, 0.8, 0.003), (flat, 0.5, 0.015), (padded({1: 1.0, 2: 1.3, 3: 1.9, 4: 1.6}), 0.9, 0.4)])
def test_branch_ideal_without_coverage_is_the_async_ideal(cost: Cost, alpha: float,
                                                          draft_s: float) -> None:
    assert branch_ideal(cost, alpha, draft_s, 8, cover=0.0) == \
        async_ideal(cost, alpha, draft_s, 8)


@pytest.mark.parametrize(("alpha", "draft_s"), [(0.5, 0.003), (0.8, 0.003), (0.8, 0.015),
                                                (0.95, 0.003)])
def test_branch_ideal_grows_with_coverage_up_to_at_most_free_drafts(alpha: float,
                                                                    draft_s: float) -> None:
    free, _ = free_draft_bound(flat, alpha, 8)
    ideals = [branch_ideal(flat, alpha, draft_s, 8, cover)[0]
              for cover in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert ideals == sorted(ideals) and ideals[0] == async_ideal(flat, alpha, draft_s, 8)[0]
    # a Monte Carlo figure (10,000 tokens) against an exact one: 1 % of noise allowed
    assert ideals[0] < ideals[-1] <= 1.01 * free


def test_a_branch_ready_after_every_rejection_with_a_fast_draft_nears_free_drafts() -> None:
    free, _ = free_draft_bound(flat, 0.8, 8)
    ideal, _ = async_ideal(flat, 0.8, 0.003, 8)
    branched, _ = branch_ideal(flat, 0.8, 0.003, 8, cover=1.0, n_tokens=4000)
    assert ideal < 0.7 * free and branched == pytest.approx(free, rel=0.05)


def test_a_branch_helps_only_where_the_draft_had_reached_the_miss() -> None:
    # The draft's token 0 is wrong: lead's first step corrects it. A draft that made its
    # row at position 0 in time (0.01 s < the 1 s step) has the branch: the next step
    # verifies 4 tokens. One that takes 2 s per token had not: it starts over.
    def wrong_first(n: int) -> int:
        return 0 if n == 0 else 1 << 30

    def step(b: int) -> float:
        return 1.0
    fast = simulate(step, wrong_first, 0.01, 4, 6, covered=lambda _: True)
    assert fast == 2.0  # 1 token, then 1 + 4 tokens
    assert simulate(step, wrong_first, 0.01, 4, 6) > fast  # uncovered: starts over at 1 s
    assert simulate(step, wrong_first, 2.0, 4, 6, covered=lambda _: True) == \
        simulate(step, wrong_first, 2.0, 4, 6)


def test_a_replayed_branch_is_ready_only_where_the_drafts_runner_up_was_right() -> None:
    # The draft is wrong at reply positions 2 and 6; its runner-up is the target's token
    # at 2 only. Each step costs 1 s and the draft is fast: after the miss at 2 the branch
    # is ready (the next step verifies a full draft), after the miss at 6 nothing is.
    agrees = [True, True, False, True, True, True, False, *[True] * 9]
    covered_at_2 = [i == 2 for i in range(len(agrees))]
    neither, _ = replayed_ideal(lambda b: 1.0, agrees, 0.001, 4)
    only_2, _ = replayed_ideal(lambda b: 1.0, agrees, 0.001, 4, covers=covered_at_2)
    both, _ = replayed_ideal(lambda b: 1.0, agrees, 0.001, 4,
                             covers=[i in (2, 6) for i in range(len(agrees))])
    assert neither < only_2 < both


def test_a_primed_path_is_ready_at_the_first_step() -> None:
    # A draft as slow as lead's step has nothing at lead's first step unless it was
    # drafted while lead evaluated the prompt.
    def right(n: int) -> int:
        return 1 << 30
    cold = simulate(lambda b: 1.0, right, 1.0, 4, 10)
    warm = simulate(lambda b: 1.0, right, 1.0, 4, 10, primed=True)
    assert warm < cold


def test_coverage_is_a_share() -> None:
    with pytest.raises(ValueError, match="cover must be a share"):
        branch_ideal(flat, 0.8, 0.003, 8, cover=1.5)


def _reply(config: str, prompt: int, round_: int, seconds: float, text: str = "same") -> Result:
    return Result(config, prompt, tokens=11, decode_s=seconds, ttft_s=0.1, text=text,
                  round=round_)


def test_per_prompt_figures_pool_the_rounds_and_count_differing_prompts() -> None:
    alone = [_reply("alone", p, r, 1.0) for r in range(2) for p in range(2)]
    # prompt 0: 2x then 1x faster (pooled: 20 tokens in 1.5 s); prompt 1 differs once
    duo = [_reply("duo", 0, 0, 0.5), _reply("duo", 1, 0, 1.0),
           _reply("duo", 0, 1, 1.0), _reply("duo", 1, 1, 2.0, text="other")]
    table = per_prompt({"alone": alone, "duo": duo}, "alone", ["duo"])
    assert "| 0 | 10.00 | 1.33x |" in table and "| 1 | 10.00 | 0.67x |" in table
    assert "**0.67x**" in table
    summary = summarise("duo", duo, alone)
    assert summary.prompts == 2 and summary.differing == 1
    assert summary.tok_s == pytest.approx(40 / 4.5)


def test_pooled_speedup_weighs_prompts_by_their_plain_time() -> None:
    # 1 s at 2x and 1 s at 1x: 2 s plain, 1.5 s sped up (not the mean of 2 and 1)
    assert pooled_speedup({0: 1.0, 1: 1.0}, {0: 2.0, 1: 1.0}) == pytest.approx(2 / 1.5)
    assert pooled_speedup({0: 3.0, 1: 1.0}, {0: 1.0, 1: 2.0}) == pytest.approx(4 / 3.5)


def test_padding_makes_a_short_batch_cost_no_more_than_a_longer_cheaper_one() -> None:
    costs = {1: 1.0, 2: 1.6, 3: 2.0, 4: 1.5, 5: 2.2}
    cost = padded(costs)
    assert [cost(b) for b in range(1, 6)] == [1.0, 1.5, 1.5, 1.5, 2.2]
    # With a draft at 0.4 of a target token (as on one CPU), lead often has 1-2 draft
    # tokens after a rejection: the bound must credit verifying them at the padded price.
    assert async_ideal(cost, 0.9, 0.4, 4)[0] > async_ideal(costs.__getitem__, 0.9, 0.4, 4)[0]


def test_the_best_length_stops_before_a_token_unlikely_to_be_right() -> None:
    assert best_length(flat, [0.9, 0.9, 0.9]) == 3
    assert best_length(flat, [0.9, 0.9, 0.01, 0.9]) == 2  # a token more costs ~2 %
    assert best_length(linear, [0.9, 0.9]) == 0  # b tokens cost b steps: none pays
    assert best_length(flat, []) == 0


def test_p_accept_per_token_gain_where_they_tell_right_tokens_from_wrong() -> None:
    # A fifth of the draft's tokens are wrong, at random; a token more costs 30 % of a
    # step. Odds that know the wrong ones stop each step before them: better than any
    # fixed K. Odds that say nothing (the same for all) are a fixed K.
    def cost(b: int) -> float:
        return 1.0 + 0.3 * (b - 1)
    agrees = [bool(x) for x in np.random.default_rng(0).random(400) > 0.2]
    fixed, _ = replayed_ideal(cost, agrees, 0.001, 8)
    knowing = per_token_ideal(cost, agrees, [0.95 if a else 0.05 for a in agrees], 0.001, 8)
    blind = per_token_ideal(cost, agrees, [0.8] * len(agrees), 0.001, 8)
    assert knowing > 1.05 * fixed
    assert blind == pytest.approx(fixed, rel=0.01)  # (it alone stops at the reply's end)


def test_band_p_accept_are_the_share_right_in_each_band_of_q() -> None:
    agrees = [[True, False, True], [True]]
    probs = [[0.9, 0.95, 0.2], [0.97]]
    assert band_p_accept(agrees, probs, (0.0, 0.5, 0.95)) == [[1.0, 0.5, 1.0], [0.5]]


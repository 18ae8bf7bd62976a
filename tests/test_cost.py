"""The cost model: prices, acceptance, the probe schedule, and the policy over them."""

from __future__ import annotations

import pytest

from lead.policy.acceptance import Rate, expected_accepted
from lead.policy.cost import CostModel
from lead.policy.prices import Prices
from lead.policy.probes import AfterProbe, ProbeSchedule
from lead.policy.scoreboard import DECAY, PRIOR, RECENT, Record

# measured on a 2-core Xeon (one thread): b=4 is cheaper than b=3
XEON = {1: 1.0, 2: 1.64, 3: 2.09, 4: 1.56, 5: 2.21, 6: 2.71, 7: 3.09, 8: 3.02, 9: 3.37}
# measured on a 2-core AMD EPYC (AVX-512), one thread: perfect drafts pay only quiet
EPYC = {1: 1.0, 2: 1.84, 3: 2.57, 4: 3.25, 5: 4.04, 6: 4.8, 7: 5.6, 8: 8.25, 9: 8.9}

# --- prices ---


def test_prices_pad_a_short_batch_to_a_cheaper_larger_one() -> None:
    prices = Prices()
    prices.calibrate({b: 0.1 * x for b, x in XEON.items()})
    assert [prices.batch_for(b) for b in (1, 2, 3, 4, 5, 8)] == [1, 4, 4, 4, 5, 8]
    assert prices.relative(3) == pytest.approx(1.56)  # 3 tokens cost what the b=4 batch does
    noise = Prices()
    noise.calibrate({1: 0.1, 2: 0.102, 3: 0.101})  # 1 % cheaper is noise, not a saving
    assert [noise.batch_for(b) for b in (1, 2, 3)] == [1, 2, 3]


def test_prices_keep_plain_decoding_quiet_and_measure_the_slowdown_apart() -> None:
    prices = Prices()
    prices.calibrate({1: 0.1, 2: 0.15})
    for _ in range(20):
        prices.record(1, 0.13, busy=True)  # one-token steps while a back drafts
    assert prices.plain() == pytest.approx(0.1)
    assert prices.slowdown == pytest.approx(1.3, abs=0.01)
    assert prices.busy_s(2) == pytest.approx(0.15 * prices.slowdown)
    prices.record(1, 0.05)  # a quiet step moves plain decoding's price, by the EWMA
    assert prices.plain() == pytest.approx(0.09)
    prices.slowdown = 1.0  # (as a probe from a hush sets it)
    assert prices.busy_s(2) == pytest.approx(0.09 * 1.5)


def test_prices_an_unpriced_size_on_the_line_between_priced_ones_or_at_the_largest() -> None:
    prices = Prices()
    assert prices.plain() == 1.0 and prices.largest == 1  # nothing measured yet
    prices.record(1, 0.05)
    prices.record(3, 0.1)  # a size's first price sets its shape
    assert prices.shape[3] == pytest.approx(2.0) and prices.largest == 3
    assert prices.shape_of(2) == pytest.approx(1.5)  # between b=1 and b=3
    assert prices.shape_of(7) == pytest.approx(2.0)  # past them all: tried at b=3's price
    assert prices.cost_s == {1: 0.05, 3: 0.1}


def test_prices_set_a_sizes_shape_from_its_first_price_at_the_slowdown_as_it_stands() -> None:
    prices = Prices()
    prices.record(1, 0.1, busy=True)  # no quiet step yet: plain decoding priced from a busy one
    assert prices.plain_s == pytest.approx(0.1)
    prices.record(1, 0.15, busy=True)  # the same size again: slower means a slowdown
    assert prices.slowdown == pytest.approx(1.1) and prices.plain_s == pytest.approx(0.1)
    prices.record(3, 0.33, busy=True)  # a new size: 3x a quiet token, at slowdown 1.1
    assert prices.shape[3] == pytest.approx(3.0)


def test_prices_say_how_much_faster_drafts_right_every_time_could_decode() -> None:
    prices = Prices()
    assert prices.ceiling() == (1.0, 1)  # nothing priced: one token a step
    prices.calibrate({1: 0.1, 4: 0.24, 32: 1.2, 64: 2.6})  # 4/2.4, 32/12, 64/26 tokens a step
    assert prices.ceiling() == (pytest.approx(32 / 12), 32)  # the longest batch is not the best
    assert "at most 2.67x as fast (b=32)" in prices.describe()


# --- acceptance ---


def test_acceptance_follows_a_drop_within_its_window_of_outcomes() -> None:
    record = Record()
    for _ in range(50):
        record.record(8, False)  # whole drafts right
    assert record.alpha > 0.95
    record.record(0, True)
    record.record(0, True)
    assert record.alpha > 0.75  # two misses after 50 good drafts: could be noise
    record.record(0, True)
    assert record.alpha < 0.35  # the whole window missed: the drop shows at once
    slow = Record(rest=Rate(PRIOR, DECAY, 50))  # decayed counts alone would take longer
    for outcome in [(8, False)] * 50 + [(0, True)] * 3:
        slow.record(*outcome)
    assert slow.alpha > 0.8


def test_acceptance_is_the_censored_geometric_estimate_with_its_prior() -> None:
    record = Record(rest=Rate((1.0, 1.0), 1.0, 100))
    assert record.alpha == 0.5  # the prior alone
    assert not record.record(0, False)  # nothing observed: nothing moves
    assert record.record(3, True) and record.record(2, False)  # a censored run
    assert record.alpha == pytest.approx((1 + 5) / (1 + 5 + 1 + 1))


def test_acceptance_estimates_a_replys_first_token_apart() -> None:
    record = Record()
    before = record.alpha
    assert not record.record(0, True, first=True)  # a miss at a reply's first token
    assert record.alpha == before and record.first.value < 0.5
    assert record.record(3, True, first=True)  # a hit: the rest is like any draft
    assert list(record.rest.recent) == [(2, True)] and record.first.value > 0.5
    assert not record.record(1, False, first=True)  # only its first token was seen
    assert list(record.rest.recent) == [(2, True)]


def test_acceptance_expects_a_geometric_number_of_tokens() -> None:
    record = Record(rest=Rate((50.0, 50.0)), first=Rate((1.0, 99.0)))  # 0.5, first 0.01
    assert expected_accepted(record.p_accept(0)) == 0.0
    assert expected_accepted(record.p_accept(2)) == pytest.approx(0.5 + 0.25)
    assert expected_accepted(record.p_accept(2, first=True)) == pytest.approx(0.01 * 1.5)
    sure = Record(rest=Rate((1.0, 0.0)))  # alpha 1: capped, not a division by zero
    assert expected_accepted(sure.p_accept(4)) == pytest.approx(4.0, abs=0.01)


# --- probe schedule ---


def test_probe_gaps_double_up_to_their_cap_and_reset_when_speculation_pays() -> None:
    probes = ProbeSchedule(first_gap=2, max_gap=8)
    gaps = []
    for _ in range(4):
        probes.end(AfterProbe.NOTHING_PAYS)
        gaps.append(probes.gap)
    assert gaps == [4, 8, 8, 8]
    probes.end(AfterProbe.PAYS)
    assert probes.gap == 8  # speculating: the gap applies once it stops
    probes.speculating()
    assert probes.gap == 2 and probes.since == 0
    probes.end(AfterProbe.PRICED_OUT)  # only a change of slowdown would help: wait longest
    assert probes.gap == 8


def test_hushed_probes_grow_rarer_up_to_their_own_cap() -> None:
    probes = ProbeSchedule(first_gap=2, max_gap=8, max_hushed_gap=40)
    gaps = []
    for _ in range(5):
        probes.end(AfterProbe.HUSHED)
        gaps.append(probes.gap)
    assert gaps == [8, 16, 32, 40, 40]


def test_a_probe_is_due_after_its_gap_and_ends_on_its_outcomes_or_steps() -> None:
    probes = ProbeSchedule(first_gap=3, outcomes=2, max_steps=4)
    assert [probes.quiet_step() for _ in range(3)] == [False, False, True]
    probes.start()
    assert probes.probing == 2
    assert [probes.outcome(), probes.outcome()] == [False, True]
    probes.end(AfterProbe.NOTHING_PAYS)
    assert probes.probing == 0 and probes.since == 0 and probes.gap == 6
    probes.start()
    assert [probes.probe_step() for _ in range(4)] == [False, False, False, True]


# --- the policy ---


def believing(alpha: float, probes: ProbeSchedule | None = None) -> CostModel:
    """A cost model whose back's prior acceptance is `alpha` (weight 100)."""
    model = CostModel(max_draft=8, probes=probes or ProbeSchedule())
    model.scores.records["b"] = Record(rest=Rate((100 * alpha, 100 * (1 - alpha)), DECAY, RECENT))
    model.scores.backs["b"] = None  # the back it prices drafts by
    return model


def calibrated(alpha: float, shape: dict[int, float],
               probes: ProbeSchedule | None = None) -> CostModel:
    """A model that believes `alpha`, with quiet prices 0.1 s x shape."""
    model = believing(alpha, probes)
    model.prices.calibrate({b: 0.1 * x for b, x in shape.items()})
    return model


def probing(first: int, every: int, **kw: int) -> ProbeSchedule:
    return ProbeSchedule(first_gap=first, max_gap=every, **kw)


def test_cost_model_switches_speculation_off_where_verify_is_expensive() -> None:
    cpu = believing(0.5)
    for b in range(1, 10):
        cpu.record_step(b, 0.05 * b)  # verify cost linear in b (compute-bound CPU)
    assert cpu.verify_len() == 0


def test_cost_model_drafts_long_where_verify_is_flat() -> None:
    gpu = believing(0.9)
    for b in range(1, 10):
        gpu.record_step(b, 0.02)  # flat cost: memory-bound GPU
    assert gpu.verify_len() >= 6


def test_cost_model_learns_acceptance_from_unverified_drafts() -> None:
    model = CostModel(max_draft=4, probes=probing(8, 8, outcomes=2))
    for b in (1, 2, 3):
        model.record_step(b, 0.05 * (1 + (b - 1) / 2))  # b=2 1.5x, b=3 2x
    for _ in range(30):
        model.scores.record("b", 0, True)  # drafts on offer were wrong at their first token
    assert model.alpha < 0.25 and model.verify_len() == 0
    asked = []
    for step in range(21):
        model.record_step(1, 0.05)
        asked.append(model.draft_len())
        if asked[-1] and step % 3 == 0:  # a draft on offer at every third probe step
            model.scores.record("b", 0, True)
    # 8 quiet steps after speculation stopped, a probe asks until 2 drafts were compared
    # (at loop steps 9 and 12), then lead is quiet for 8 steps again.
    assert asked[:7] == [0] * 7 and asked[7:13] == [1] * 6
    assert asked[13:20] == [0] * 7 and asked[20] == 1
    for _ in range(30):  # plain steps whose offered draft proved right: no verify paid
        model.scores.record("b", 1, False)
    assert model.alpha > 0.9 and model.verify_len() >= 2 and model.draft_len() >= 2


def _probe_pattern(model: CostModel, steps: int, outcome: tuple[int, bool] | None,
                   busy: bool = False) -> str:
    """wanted() after each plain step, as a string; `outcome` is recorded whenever a
    draft is wanted (None: no back ever offers one); `busy`: steps taken while it drafts
    (at the quiet price)."""
    asked = ""
    for _ in range(steps):
        model.record_step(1, model.prices.plain() if model.prices.plain_s else 0.05,
                          busy=busy and asked[-1:] not in ("", "0"))
        asked += str(model.draft_len())
        if outcome is not None and asked[-1] != "0":
            model.scores.record("b", *outcome)
    return asked


def test_probes_back_off_while_nothing_pays_and_end_without_outcomes() -> None:
    model = CostModel(max_draft=4, probes=probing(2, 8, max_steps=3))
    model.record_step(1, 0.05)
    model.record_step(2, 0.1)  # b=2 costs 2x: nothing pays without evidence of acceptance
    for _ in range(20):
        model.scores.record("b", 0, True)
    # No back ever offers a draft: each probe ends after 3 steps, and the quiet gap
    # doubles from 2 steps (one of them the b=2 step) to at most 8.
    assert _probe_pattern(model, 40, None) == \
        "0" + "111" + "0" * 4 + "111" + "0" * 8 + "111" + "0" * 8 + "111" + "0" * 7


def test_the_first_probe_comes_early_again_after_speculation_ran() -> None:
    model = CostModel(max_draft=4, probes=probing(2, 8, outcomes=2))
    model.record_step(1, 0.05)
    model.record_step(2, 0.075)  # b=2 costs 1.5x
    # drafts miss: probes of 2 outcomes, gaps growing to 8 steps (7 after the probe's)
    assert "11" + "0" * 7 + "11" in _probe_pattern(model, 60, (0, True))
    for _ in range(10):
        model.scores.record("b", 3, False)  # then drafts are right: lead speculates
    assert _probe_pattern(model, 3, None) == "222"  # k = 2 pays
    for _ in range(3):
        model.scores.record("b", 0, True)  # and wrong again: speculation stops
    assert _probe_pattern(model, 4, None)[:2] == "01"  # a probe on the second quiet step


def test_cost_model_follows_a_change_of_prompt_within_a_few_steps() -> None:
    model = CostModel(max_draft=8)
    for _ in range(50):
        model.scores.record("b", 8, False)  # a code reply: whole drafts right
    assert model.alpha > 0.95
    for _ in range(3):
        model.scores.record("b", 1, True)  # then prose: a miss after one match, every step
    assert model.alpha < 0.7
    for _ in range(3):
        model.scores.record("b", 0, True)  # then only misses
    assert model.alpha < 0.35
    for _ in range(3):
        model.scores.record("b", 8, False)  # and code again
    assert model.alpha > 0.8


def test_a_replys_first_token_is_estimated_apart() -> None:
    model = believing(0.97)
    for b in range(1, 10):
        model.record_step(b, 0.05 * (1 + (b - 1) / 2))  # b=2 1.5x, b=3 2x, ...
    assert model.verify_len() >= 2  # mid-reply, drafts pay
    # a reply's first token: no evidence yet, so nothing is verified, but a draft is
    # still asked for, so that lead learns how often it is right
    assert model.verify_len(first=True) == 0 and model.draft_len(first=True) == 1
    for _ in range(5):
        model.scores.record("b", 0, True, first=True)  # chat replies: the first guess misses
    seen = model.scores.leader
    assert seen.first.value < 0.2 and seen.alpha > 0.95  # mid-reply estimate untouched
    assert model.verify_len(first=True) == 0 and model.verify_len() >= 2
    for _ in range(15):
        model.scores.record("b", 4, False, first=True)  # completions: first guesses right
    assert model.scores.leader.first.value > 0.8 and model.verify_len(first=True) >= 2


def test_cost_model_explores_batch_sizes_one_at_a_time() -> None:
    model = believing(0.95)
    assert model.verify_len() == 1  # only b=1 priced: try b=2 first, not b=9
    model.record_step(1, 0.05)
    model.record_step(2, 0.05)
    assert model.verify_len() == 2


def test_a_calibrated_model_verifies_the_paying_length_without_exploring() -> None:
    model = calibrated(0.86, XEON)
    assert model.verify_len() == 3  # b=4, found at once: no step spent at b=2 or b=3
    assert model.verify_len(available=2) == 2  # where only 2 draft tokens are on offer


def test_a_short_draft_is_padded_to_a_cheaper_larger_batch() -> None:
    model = calibrated(0.68, XEON)
    assert [model.prices.batch_for(b) for b in (1, 2, 3, 4, 5)] == [1, 4, 4, 4, 5]
    # 2 draft tokens: 2.14 tokens expected, for 1.56x at b=4 padded (2.09x at b=3)
    assert model.verify_len(available=2) == 2
    flat = calibrated(0.68, {1: 1.0, 2: 1.02, 3: 1.01, 4: 1.03})  # a GPU: noise, not gain
    assert [flat.prices.batch_for(b) for b in (2, 3)] == [2, 3]


def test_a_drafting_backs_slowdown_switches_speculation_off() -> None:
    model = calibrated(0.96, {1: 1.0, 2: 1.8, 3: 2.6, 4: 3.4, 5: 4.2})
    assert model.verify_len() >= 2  # quiet prices: 2.88 tokens for 2.6x at k=2
    for _ in range(10):
        model.record_step(1, 0.12, busy=True)  # plain steps 1.2x slower while it drafts
    assert model.prices.slowdown > 1.15 and model.verify_len() == 0
    assert model.prices.plain() == pytest.approx(0.1)  # plain decoding is priced quiet


def test_one_slow_step_does_not_price_a_length_out_for_good() -> None:
    model = calibrated(0.9, XEON, probes=probing(2, 8, outcomes=2))
    model.record_step(4, 0.1 * 1.56 * 6.5, busy=True)  # one b=4 step 6.5x its quiet price
    assert model.verify_len() == 0
    asked = _probe_pattern(model, 20, None, busy=True)  # probes: the back drafts again
    # the probe measured the back's slowdown afresh: normal steps brought the price back
    assert "3" in asked and model.verify_len() == 3


def test_where_not_even_perfect_drafts_pay_backs_are_never_asked() -> None:
    model = calibrated(0.99, {b: float(b) for b in range(1, 10)})  # cost linear in b
    assert not model.could_pay(1.0) and "not even perfect drafts" in model.describe()
    assert model.draft_len(first=True) == 0  # not even for a reply's first token
    assert _probe_pattern(model, 100, (8, False)) == "0" * 100  # and no probes


def _prose_step(model: CostModel, slow: float) -> str:
    """One plain step of a reply the draft gets wrong; a back drafts whenever lead asks, and
    steps taken while it drafts cost `slow` times their quiet price. H: backs are hushed."""
    drafting = model.draft_len() > 0
    model.record_step(1, 0.1 * (slow if drafting else 1.0), busy=drafting)
    if drafting:
        model.scores.record("b", 0, True)
    return "H" if model.hush else "p" if model.probes.probing else "."


def test_a_back_that_slows_lead_so_much_drafts_cannot_pay_is_hushed_until_it_stops() -> None:
    model = calibrated(0.3, EPYC, probes=probing(2, 8, outcomes=2))
    assert model.could_pay(1.0) and model.verify_len() == 0 and not model.hush
    slowed = "".join(_prose_step(model, 1.5) for _ in range(200))
    assert slowed[-100:].count("H") >= 95  # probes grow rare: 2 steps in 64, then 128
    assert model.hush and model.draft_len(first=True) == 0  # not even a reply's first token
    # the back moves to a core of its own: its next probe finds no slowdown
    freed = "".join(_prose_step(model, 1.0) for _ in range(300))
    assert freed[-100:].count("H") == 0 and "p" in freed[-100:]  # probed again


def test_a_probe_from_a_hush_asks_for_drafts_until_it_has_measured_the_back() -> None:
    model = calibrated(0.3, EPYC, probes=probing(2, 8, outcomes=3))
    for until in (lambda: model.hush, lambda: model.probes.probing > 0):
        for _ in range(200):
            if until():
                break
            _prose_step(model, 1.5)
    assert model.probes.probing  # the probe measures the back afresh
    assert model.prices.slowdown == 1.0
    asked = []
    while model.probes.probing and len(asked) < 16:  # its slowed steps bring the slowdown back...
        asked.append(model.draft_len())
        assert not model.hush  # ...over hush_at, yet the probe goes on
        _prose_step(model, 1.5)
    assert asked == [1, 1, 1] and model.prices.slowdown > model.hush_at and model.hush


def test_a_back_whose_perfect_drafts_would_still_pay_is_not_hushed() -> None:
    model = calibrated(0.3, XEON, probes=probing(2, 8, outcomes=2))
    slowed = "".join(_prose_step(model, 1.5) for _ in range(200))
    assert model.could_pay(model.prices.slowdown) and "H" not in slowed  # probes go on


def test_cost_model_fixed_and_available() -> None:
    assert CostModel(max_draft=8, fixed=3).verify_len() == 3
    assert CostModel(max_draft=8, fixed=3).verify_len(available=2) == 2
    assert CostModel(max_draft=8, fixed=3).draft_len() == 3


def test_snapshot_reports_measured_prices_and_estimates() -> None:
    model = calibrated(0.9, XEON)
    model.record_step(4, 0.2, busy=True)
    snap = model.snapshot()
    assert model.prices.cost_s[4] == 0.2 and 1 not in model.prices.cost_s  # measured only
    assert snap["slowdown"] == model.prices.slowdown > 1.0 and snap["hush"] == 0.0
    assert snap["alpha"] == pytest.approx(0.9) and snap["alpha_first"] == 0.5


# --- prices given, not measured (--verify-cost) ---


def test_given_prices_go_on_by_their_last_step() -> None:
    prices = Prices()
    prices.fix([1.5, 1.8], up_to=6)
    assert prices.shape == pytest.approx({1: 1.0, 2: 1.5, 3: 1.8, 4: 2.1, 5: 2.4, 6: 2.7})
    prices.fix([1.2], up_to=4)  # one cost: every larger batch costs the same
    assert prices.shape == pytest.approx({1: 1.0, 2: 1.2, 3: 1.2, 4: 1.2})


def test_prices_where_drafts_never_pay_ask_no_back_even_for_perfect_drafts() -> None:
    model = CostModel(max_draft=8)
    model.fix_prices([2.0, 3.0])  # a batch costs what its tokens cost one at a time
    for _ in range(50):
        model.scores.record("b", 8, False)  # every draft right
    assert model.alpha > 0.95
    assert model.verify_len() == 0 and model.draft_len(first=True) == 0
    assert not model.could_pay(1.0)


def test_prices_where_drafts_always_pay_stay_given_whatever_steps_cost() -> None:
    model = CostModel(max_draft=8)
    model.fix_prices([1.0])
    for _ in range(30):  # measured steps say a wide batch is dear and a back slows lead
        model.record_step(9, 0.9, busy=True)
        model.record_step(1, 0.1)
        model.record_step(1, 0.3, busy=True)
    assert model.prices.shape[9] == 1.0 and model.prices.slowdown == 1.0 and not model.hush
    assert model.prices.plain() == pytest.approx(0.1)  # one token's time is still measured
    assert model.verify_len() == 8 and model.draft_len() == 8

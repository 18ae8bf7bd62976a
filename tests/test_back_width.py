"""How many branches the back grows: its draft's prices per batch size against lead's step."""

from __future__ import annotations

import pytest

from back.jobs import ahead_for
from back.width import (
    FORGET_CALLS,
    PER_BRANCH,
    STALE_S,
    DraftPrices,
    StepClock,
    choose_width,
    least_squares,
)


def prices(**by_size: float) -> DraftPrices:
    book = DraftPrices()
    for size, seconds in by_size.items():
        book.note(int(size.lstrip("b")), seconds)
    return book


def test_prices_follow_measurements_and_a_line_through_them() -> None:
    book = DraftPrices()
    assert book.of(1) is None
    book.note(1, 0.010)
    book.note(1, 0.020)  # a moving average: the old price still counts
    assert book.of(1) == pytest.approx(0.012)
    assert book.of(2) is None  # never measured that large
    book.note(3, 0.030)
    assert book.of(2) == pytest.approx(0.021)  # on the line through (1, 12 ms), (3, 30 ms)
    assert book.of(4) is None


def test_the_line_is_fitted_again_after_each_new_price() -> None:
    book = prices(b1=0.010, b3=0.030)
    assert book.of(2) == pytest.approx(0.020)
    book.note(3, 0.050)  # (a moving average: 30 ms -> 34 ms)
    assert book.of(2) == pytest.approx((0.010 + 0.034) / 2)


def test_the_step_under_way_ends_a_step_after_its_news() -> None:
    clock = StepClock()
    assert clock.ends_at() is None
    for n, at in ((10, 0.0), (11, 1.0), (12, 1.2)):  # (the first gap: the prompt)
        clock.note(n, at)
    assert clock.ends_at() == pytest.approx(1.4)
    clock.note(12, 1.3)  # no new tokens: the step under way is the same
    assert clock.ends_at() == pytest.approx(1.4)


def test_the_fitted_line_is_least_squares() -> None:
    assert least_squares({1: 3.0, 2: 5.0, 4: 9.0}) == pytest.approx((2.0, 1.0))  # exact
    slope, base = least_squares({1: 1.0, 2: 3.0, 3: 2.0})  # residuals balance
    assert (slope, base) == pytest.approx((0.5, 1.0))


def test_lead_s_step_is_the_time_between_states_that_add_tokens() -> None:
    clock = StepClock()
    clock.note(10, 98.0)
    clock.note(11, 99.8)  # the session's first gap: the prompt's evaluation, not a step
    assert clock.step_s is None
    clock.note(11, 99.85)  # no new tokens: not a step
    clock.note(13, 100.0)
    assert clock.step_s == pytest.approx(0.2)
    clock.note(14, 100.2 + STALE_S + 1)  # a pause, not a step
    assert clock.step_s == pytest.approx(0.2)
    clock.note(16, 100.2 + STALE_S + 1.1)
    assert 0.1 < clock.step_s < 0.2
    step_s = clock.step_s
    clock = StepClock(step_s)  # a new session's clock starts from the last one's step
    clock.note(40, 500.0)
    clock.note(41, 502.0)  # a new session's prompt
    assert clock.step_s == step_s
    clock.note(42, 502.3)
    assert clock.step_s > step_s


def test_no_width_without_a_step_time_a_price_or_leave_to_branch() -> None:
    flat = prices(b1=0.003, b9=0.003)
    assert choose_width(flat, None, 8, 8) == 0
    assert choose_width(DraftPrices(), 0.03, 8, 8) == 0
    assert choose_width(flat, 0.03, 8, 0) == 0


def test_where_a_wider_batch_costs_the_same_the_back_goes_wide() -> None:
    # a GPU-like draft: a batch of 9 costs what one token does, even if lead's step
    # leaves no time to spare per guess
    flat = prices(b1=0.003, b5=0.0031, b9=0.0032)
    assert choose_width(flat, 0.01, 8, 8) == 8
    assert choose_width(flat, 0.01, 8, 3) == 3  # never past the setting


def test_where_each_token_costs_its_own_time_and_lead_s_step_leaves_none_the_chain_is_alone(
        ) -> None:
    cpu = prices(b1=0.070, b2=0.093, b3=0.123)  # measured: the 0.5B draft on one core
    # lead's steps with the 1.5B on the other core (verify costs 1.67x one token at b=2,
    # 1.58x at b=4): two drafts' worth of guesses at 93 ms each do not fit in them
    for draft_len, step_s in ((1, 0.23), (2, 0.29), (3, 0.217), (8, 0.42)):
        assert choose_width(cpu, step_s, ahead_for(draft_len, 16), 8) == 0
    assert choose_width(cpu, 0.23, 2, 8) == 0  # even two guesses in a step at b=2


def test_a_branch_adding_a_tenth_of_a_guess_is_cheap_and_all_together_a_quarter() -> None:
    assert choose_width(prices(b1=0.010, b9=0.0164), 0.03, 16, 8) == 3  # 8 % a branch
    assert choose_width(prices(b1=0.010, b9=0.0196), 0.03, 16, 8) == 0  # 12 % a branch
    linear = prices(b1=0.010, b9=0.0128)  # 3.5 % a branch
    assert choose_width(linear, 0.03, 16, 8) == 7  # 8 would add 28 % in all


def test_spare_time_buys_as_many_branches_as_fit_in_lead_s_step() -> None:
    cpu = prices(b1=0.070, b2=0.093, b3=0.123, b4=0.133, b5=0.200)
    # on the line through them a batch of 4 costs 154 ms, of 5 184 ms: eight guesses of
    # the first fit in 0.8 of lead's 1.6 s step, of the second not
    assert choose_width(cpu, 1.6, 8, 8) == 3
    assert choose_width(cpu, 1.4, 8, 8) < 3


def test_a_batch_larger_than_any_measured_is_tried_once_narrower_ones_fit() -> None:
    book = prices(b1=0.003)
    assert choose_width(book, 0.03, 8, 8) == 1  # try a batch of 2
    book.note(2, 0.003 * (1 + PER_BRANCH / 2))
    assert choose_width(book, 0.03, 8, 8) == 2  # then 3
    book.note(3, 0.010)  # far dearer: the line through all three says so
    assert choose_width(book, 0.03, 8, 8) < 2


def test_a_size_not_measured_for_a_while_is_measured_afresh() -> None:
    """One slow wide call on a busy machine must not keep the back narrow for good: at
    width 0 only lone guesses are measured, so the slow price would never be replaced."""
    book = prices(b1=0.003, b2=0.0031, b9=0.050)  # b9: a call that met a busy machine
    assert choose_width(book, 0.03, 16, 8) == 0
    for _ in range(FORGET_CALLS):
        book.note(1, 0.003)  # the chain alone, all the back measures at width 0
    assert book.of(9) is None and book.of(2) is None
    assert choose_width(book, 0.03, 16, 8) == 1  # tries a batch of 2 again
    for width in range(1, 9):
        book.note(1 + width, 0.0031)
    assert choose_width(book, 0.03, 16, 8) == 8


def test_lead_s_word_on_its_step_s_end_counts_over_the_measured_step() -> None:
    clock = StepClock()
    for n, at in ((3, 0.0), (4, 1.0), (5, 1.1)):  # steps measured at 100 ms
        clock.note(n, at)
    assert clock.ends_at() == pytest.approx(1.2)
    clock.note(6, 1.15, left=0.02)  # lead: a short step (it verifies no draft)
    assert clock.ends_at() == pytest.approx(1.17)
    clock.note(6, 1.16)  # a post's reply, no news of a step: the word stands
    assert clock.ends_at() == pytest.approx(1.17)
    clock.note(7, 1.3)  # a lead that says nothing: the measured step again
    assert clock.ends_at() == pytest.approx(1.3 + clock.step_s)

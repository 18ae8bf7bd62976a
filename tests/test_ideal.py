"""The benchmark's bounds: pure functions of costs and acceptance, checked at their limits."""

from __future__ import annotations

import pytest

from bench.ideal import async_ideal, expected_tokens, free_draft_bound


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

"""bench/replay.py: lead's own drafts replayed over a recorded reply, counted exactly."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from bench import prompts as bench_prompts
from bench.replay import EPYC_25, FAMILY_26, prices_arg, record, relative, replay_all


def echo_with_an_edit() -> tuple[list[int], list[int]]:
    rng = np.random.default_rng(3)
    source = [int(t) for t in rng.integers(100, 10_000, 300)]
    return [1, *source, 2], [*source[:120], 7, 8, *source[121:]]  # one token changed to two


def test_the_policy_drafts_an_echo_and_the_oracle_bounds_it() -> None:
    pairs = [echo_with_an_edit()] * 2
    policy, best = replay_all(pairs, EPYC_25), replay_all(pairs, EPYC_25, oracle=True)
    assert [r.tokens for r in policy] == [301, 301]
    assert all(r.steps < r.tokens / 3 and r.speedup > 1.5 for r in policy)
    assert all(b.wasted == 0 and b.speedup >= a.speedup for a, b in zip(policy, best, strict=True))
    assert policy[1].steps < policy[0].steps  # the same reply again: learned, and remembered


def test_where_batches_never_pay_every_step_is_plain() -> None:
    dear = prices_arg("2.5,3.5")
    [r] = replay_all([echo_with_an_edit()], dear)
    assert (r.steps, r.time, r.wasted, r.speedup) == (301, 301.0, 0, 1.0)


def test_prices_between_the_given_sizes_are_interpolated() -> None:
    price = relative({1: 1.0, 9: 5.0, 65: 29.0})
    assert (price(1), price(5), price(9), price(37), price(130)) == (1.0, 3.0, 5.0, 17.0, 58.0)


def test_where_batches_are_cheaper_the_same_drafts_are_verified_longer_and_pay_more() -> None:
    pairs = [echo_with_an_edit()]
    [dear], [cheap] = replay_all(pairs, EPYC_25), replay_all(pairs, FAMILY_26)
    assert cheap.steps < dear.steps and cheap.speedup > dear.speedup


def test_recording_twice_over_asks_every_prompt_again_after_the_first_round(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[str, int]] = []

    def post(url: str, timeout: float, json: dict) -> httpx.Response:
        text = json["messages"][0]["content"]
        asked.append((text, json["max_tokens"]))
        body = {"choices": [{"message": {"content": f"reply {len(asked)}"}}]}
        return httpx.Response(200, json=body, request=httpx.Request("POST", url))

    monkeypatch.setattr(httpx, "post", post)
    record("127.0.0.1:1", tmp_path / "r.json", "bench", rounds=2)
    texts = [p["text"] for p in bench_prompts.load("bench")]
    assert [t for t, _ in asked] == texts + texts and {n for _, n in asked} == {128}
    kept = json.loads((tmp_path / "r.json").read_text())
    assert [k["prompt"] for k in kept] == texts + texts
    assert kept[-1]["reply"] == f"reply {2 * len(texts)}"

"""Sampled drafts (rejection sampling) under mirostat and XTC stay exact: the joint law of
two emitted tokens is decoding's alone, mirostat's mu after the first token included, and
XTC's chance drawn at each position. tests/test_sampling_exact.py's target, drafts and
chi-square check; the check catches a verifier whose mu stands still along a draft."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np
import pytest

import lead.decode.verify as verifier
from lead.decode.verify import verify
from shared.sampling import Dist, distribution, mirostat_mu
from shared.wire.protocol import SamplingParams
from tests.test_sampling_exact import DRAFTS, TRIALS, V, chi_square_ok, draft_three, target_logits

SETTINGS = {
    "mirostat": SamplingParams(temperature=1.0, mirostat=1, mirostat_tau=1.0, mirostat_eta=0.8),
    "mirostat 2": SamplingParams(temperature=1.0, mirostat=2, mirostat_tau=1.0,
                                 mirostat_eta=0.8),
    "xtc": SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.2),
}


def p_of(context: list[int], params: SamplingParams, mu: float | None) -> np.ndarray:
    """The law of the token after `context`: XTC's a mixture over its chance."""
    row = target_logits(context)
    if not params.xtc_probability:
        return distribution(row, params, mu=mu).dense(V)
    on, off = distribution(row, params, coin=0.0), distribution(row, params)
    return params.xtc_probability * on.dense(V) + (1 - params.xtc_probability) * off.dense(V)


def exact_joint(params: SamplingParams) -> dict[tuple[int, int], float]:
    first = p_of([], params, None)
    out = {}
    for a in range(V):
        mu = mirostat_mu(None, params, first[a]) if params.mirostat and first[a] else None
        second = p_of([a], params, mu)
        out.update({(a, b): first[a] * second[b] for b in range(V)})
    return out


def speculative_pair(q_of: Callable[[list[int]], Dist], rng: np.random.Generator,
                     params: SamplingParams) -> tuple[int, int]:
    out: list[int] = []
    mu = None
    while len(out) < 2:
        draft, dists = draft_three(q_of, out, rng)
        rows = np.stack([target_logits(out + draft[:i]) for i in range(4)])
        verdict = verify(draft, rows, params, rng, dists, mu=mu)
        out, mu = out + verdict.emitted, verdict.mu
    return out[0], out[1]


def law_holds(params: SamplingParams, draft: str, seed: int) -> tuple[bool, float, float]:
    rng = np.random.default_rng(seed)
    counts = Counter(speculative_pair(DRAFTS[draft], rng, params) for _ in range(TRIALS))
    return chi_square_ok(counts, exact_joint(params), TRIALS)


@pytest.mark.parametrize(("name", "draft"), [("mirostat", "far"), ("mirostat 2", "close"),
                                             ("xtc", "far")])
def test_sampled_drafts_keep_the_law(name: str, draft: str) -> None:
    ok, stat, critical = law_holds(SETTINGS[name], draft, 20261201)
    assert ok, f"{name}: chi-square {stat:.1f} > {critical:.1f}"


def test_the_check_catches_a_mu_that_stands_still_along_the_draft(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifier, "mirostat_mu", lambda mu, params, p: mu)
    ok, stat, critical = law_holds(SETTINGS["mirostat 2"], "close", 5)
    assert not ok, f"a verifier blind to mu passed: chi2 {stat:.1f} <= {critical:.1f}"

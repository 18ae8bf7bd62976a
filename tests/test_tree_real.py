"""Tree-verified steps on a real model: lead's engine over SmolLM2 takes branches.

Prices are given as on a GPU (a token more costs 1 % of a step), so that the cost model
verifies trees on this CPU however busy it is. Batched and single-token evaluation differ
at near-ties (README, *Limitations*): where the reply with trees parts from lead's reply
alone, the two tokens must be a near-tie of the target's logits; exact equality is tested
with fakes (tests/test_tree.py).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lead.decode.engine import Engine
from shared.llm import load_model
from shared.model import common_prefix
from tests.test_tree import _reply, wrong_at_1_with_its_branch

pytestmark = pytest.mark.real
NEAR_TIE = 1.0  # logits; parted replies elsewhere would mean a wrong cache or verdict


def test_lead_takes_branches_on_a_real_model_and_its_cache_stays_true() -> None:
    model = load_model("smollm2-135m", threads=2, n_ctx=1024, branches=4)
    engine = Engine(model, max_draft=4, tree=4)
    # given, as --verify-cost gives them: steps measured on this CPU (or a busy one) do not
    # move them; only a quiet one-token step's price does
    engine.cost.fix_prices([1 + 0.01 * (b - 1) for b in range(2, 18)])
    prompt = model.tokenize("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.")
    alone = asyncio.run(_reply(engine, prompt, 48, lambda engine, session: None))
    reply = asyncio.run(_reply(engine, prompt, 48, wrong_at_1_with_its_branch(alone)))
    assert engine.metrics.tree_taken >= 3, engine.metrics
    assert not any(model.branch_cached)
    # before anything below evaluates afresh: the cache holds the reply's path, and its
    # next row is the one a fresh evaluation gives
    session = engine.session
    assert session is not None and model.cached == session.tokens[:-1]
    cached_row = model.evaluate(session.tokens[-1:], 1)[-1]
    model.truncate(0)
    fresh_row = model.evaluate(session.tokens, 1)[-1]
    np.testing.assert_allclose(cached_row, fresh_row, atol=1.5)
    # where the replies parted, they did so only at a near-tie
    n = common_prefix(alone, reply)
    if n < min(len(alone), len(reply)):
        model.truncate(0)
        row = model.evaluate([*prompt, *alone[:n]], 1)[-1]
        assert abs(row[alone[n]] - row[reply[n]]) < NEAR_TIE, (n, alone[n], reply[n])

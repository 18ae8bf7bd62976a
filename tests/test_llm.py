"""Real-model tier for shared/llm.py: what the back relies on when it aborts a draft."""

from __future__ import annotations

import numpy as np
import pytest

from shared.llm import LlamaModel, load_model
from shared.model import EvaluationAborted

pytestmark = pytest.mark.real


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512)


def test_an_aborted_evaluation_leaves_the_cache_as_it_was(
        model: LlamaModel, capfd: pytest.CaptureFixture[str]) -> None:
    context = model.tokenize("def add(a, b):\n    return")
    model.truncate(0)
    model.evaluate(context, 1)
    polls = []

    def stop_midway() -> bool:  # polled between the graph's operations
        polls.append(1)
        return len(polls) > 20

    capfd.readouterr()
    with pytest.raises(EvaluationAborted):
        model.evaluate(model.tokenize(" a + b", add_bos=False), 1, stop_midway)
    assert capfd.readouterr().err == ""  # llama.cpp logs each abort; routine here, so quiet
    assert model.cached == context and len(polls) == 21
    # The KV cache holds nothing of the aborted tokens: the next logits are a fresh run's.
    guess = model.tokenize(" x", add_bos=False)
    after_abort = model.evaluate(guess, 1)[-1]
    model.truncate(0)
    fresh = model.evaluate([*context, *guess], 1)[-1]
    np.testing.assert_allclose(after_abort, fresh, atol=1e-3)


def test_an_abort_check_that_raises_is_logged_and_the_evaluation_goes_on(
        model: LlamaModel, caplog: pytest.LogCaptureFixture) -> None:
    model.truncate(0)

    def broken() -> bool:
        raise ValueError("broken check")

    assert model.evaluate(model.tokenize("x = 1"), 1, broken).shape == (1, model.n_vocab)
    assert "abort check failed" in caplog.text


def test_an_abort_check_that_never_fires_changes_nothing(model: LlamaModel) -> None:
    context = model.tokenize("print(")
    model.truncate(0)
    plain = model.evaluate(context, 2)
    model.truncate(0)
    watched = model.evaluate(context, 2, lambda: False)
    np.testing.assert_array_equal(plain, watched)


@pytest.fixture(scope="module")
def branching() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512, branches=True)


def test_a_forked_sequence_gives_a_fresh_evaluations_logits_and_leaves_the_main_one(
        model: LlamaModel, branching: LlamaModel) -> None:
    context = model.tokenize("def add(a, b):\n    return a")
    draft = model.tokenize(" + b\n\nprint", add_bos=False)
    other = model.tokenize(" - b  # no", add_bos=False)
    branching.truncate(0)
    branching.evaluate([*context, *draft], 1)
    evaluated_main = list(branching.cached)

    def fresh(tokens: list[int], n_logits: int) -> np.ndarray:
        model.truncate(0)
        return model.evaluate(tokens, n_logits)

    # llama.cpp's logits for one context vary with the batch shapes and the cache's layout
    # (up to 0.9 here: the same tokens in one batch or one by one); a context one token off
    # is off by 2.5 or more
    def close(actual: np.ndarray, desired: np.ndarray) -> None:
        np.testing.assert_allclose(actual, desired, atol=1.5)

    branching.fork(len(context))
    assert branching.branch_cached == context
    rows = branching.evaluate_branch(other, len(other))
    close(rows, fresh([*context, *other], len(other)))
    assert branching.cached == evaluated_main and branching.branch_cached == [*context, *other]
    # the main sequence goes on as if no branch were there
    after = branching.evaluate([other[0]], 1)
    close(after, fresh([*evaluated_main, other[0]], 1))
    # cutting the main sequence back below the fork leaves the branch's shared prefix
    branching.truncate(2)
    more = branching.evaluate_branch([draft[0]], 1)
    close(more, fresh([*context, *other, draft[0]], 1))
    # a second fork drops the first branch
    branching.fork(2)
    again = branching.evaluate_branch(context[2:], 1)
    close(again, fresh(context, 1))

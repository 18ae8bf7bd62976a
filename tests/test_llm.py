"""Real-model tier for shared/llama/model.py: what the back relies on when it aborts a draft."""

from __future__ import annotations

import numpy as np
import pytest

from shared.llama.model import LlamaModel, load_model
from shared.model import MAIN, EvaluationAborted

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
    return load_model("smollm2-135m", threads=1, n_ctx=512, branches=2)


# llama.cpp's logits for one context vary with the batch shapes and the cache's layout (up
# to 0.9 here: the same tokens in one batch or one by one); a context one token off is off
# by 2.5 or more
def close(actual: np.ndarray, desired: np.ndarray) -> None:
    np.testing.assert_allclose(actual, desired, atol=1.5)


def test_branches_fork_off_the_main_sequence_and_grow_in_one_batch(
        model: LlamaModel, branching: LlamaModel) -> None:
    context = model.tokenize("def add(a, b):\n    return a")
    draft = model.tokenize(" + b\n\nprint", add_bos=False)
    other = model.tokenize(" - b  # no", add_bos=False)

    def fresh(tokens: list[int]) -> np.ndarray:
        model.truncate(0)
        return model.evaluate(tokens, 1)[-1]

    branching.truncate(0)
    branching.evaluate([*context, *draft], 1)
    main = list(branching.cached)
    branching.fork(0, len(context))
    branching.fork(1, 2)
    assert branching.branch_cached == [context, context[:2]]
    rows = branching.evaluate_many({MAIN: [other[0]], 0: other[:2], 1: [context[2]]})
    assert sorted(rows) == [MAIN, 0, 1]
    close(rows[MAIN], fresh([*main, other[0]]))
    close(rows[0], fresh([*context, *other[:2]]))
    close(rows[1], fresh(context[:3]))
    assert branching.cached == [*main, other[0]]
    assert branching.branch_cached == [[*context, *other[:2]], context[:3]]
    # the branch becomes the main sequence: nothing evaluated again, and it goes on
    branching.adopt(0)
    assert branching.cached == [*context, *other[:2]]
    assert branching.branch_cached[0] == [*main, other[0]]
    close(branching.evaluate([other[2]], 1)[-1], fresh([*context, *other[:3]]))
    branching.truncate(len(context))  # cut back below where it forked: the prefix stays
    close(branching.evaluate([draft[0]], 1)[-1], fresh([*context, draft[0]]))
    close(branching.evaluate_many({0: [other[1]]})[0], fresh([*main, other[0], other[1]]))


def test_an_aborted_batch_leaves_every_sequence_as_it_was(
        model: LlamaModel, branching: LlamaModel) -> None:
    context = model.tokenize("print('hello')")
    branching.truncate(0)
    branching.evaluate(context, 1)
    branching.fork(0, 3)
    branching.fork(1, len(context))
    before = (list(branching.cached), [list(b) for b in branching.branch_cached])
    with pytest.raises(EvaluationAborted):
        branching.evaluate_many({MAIN: [context[1]], 0: [context[3]], 1: [context[0]]},
                                abort=lambda: True)
    assert (branching.cached, branching.branch_cached) == before
    rows = branching.evaluate_many({MAIN: [context[1]], 0: [context[3]]})
    model.truncate(0)
    close(rows[0], model.evaluate(context[:4], 1)[-1])


def test_bad_branch_calls_are_value_errors(branching: LlamaModel) -> None:
    branching.truncate(0)
    branching.evaluate([1, 2, 3], 1)
    with pytest.raises(ValueError, match="fork"):
        branching.fork(2, 1)  # slots 0 and 1 only
    with pytest.raises(ValueError, match="fork"):
        branching.fork(0, 4)  # more than the main sequence holds
    with pytest.raises(ValueError, match="sequence"):
        branching.evaluate_many({5: [1]})
    with pytest.raises(ValueError, match="batch"):
        branching.evaluate_many({MAIN: [1] * 600})
    with pytest.raises(ValueError, match="branch"):
        branching.adopt(3)


@pytest.fixture(scope="module")
def slotted() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=256, slots=3, branches=1)


def test_a_slot_saved_and_loaded_into_another_gives_the_same_logits(
        slotted: LlamaModel) -> None:
    prompt = slotted.tokenize("The quick brown fox jumps over the lazy dog. " * 4)
    first = slotted.slot(1)
    first.evaluate(prompt, 1)
    reference = first.evaluate([42], 1)[0]
    first.truncate(len(prompt))
    state = slotted.save_slot(1)
    first.truncate(0)  # gone from the device
    assert slotted.load_slot(2, prompt, state)
    second = slotted.slot(2)
    assert second.cached == prompt and second.branch_cached == [[]]
    # the same cells (here bit for bit; the margin is for other kernels' cell orders: a
    # context one token off is off by 2.5 or more)
    np.testing.assert_allclose(second.evaluate([42], 1)[0], reference, atol=0.1)
    second.truncate(len(prompt) - 5)  # a later prompt sharing less of it
    np.testing.assert_allclose(second.evaluate([*prompt[-5:], 42], 1)[0], reference, atol=0.1)
    second.truncate(len(prompt))
    second.fork(0, len(prompt))  # its branches see the loaded cells
    np.testing.assert_allclose(second.evaluate_many({0: [42]})[0], reference, atol=0.1)


def test_a_state_llama_cpp_refuses_leaves_the_slot_empty(slotted: LlamaModel) -> None:
    slotted.slot(0).evaluate([1, 2, 3], 1)
    assert not slotted.load_slot(0, [1, 2, 3], b"\x00" * 16)
    assert slotted.slot(0).cached == []
    assert slotted.slot(0).evaluate([1, 2, 3], 1).shape == (1, slotted.n_vocab)

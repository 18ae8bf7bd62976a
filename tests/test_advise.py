"""python -m bench --advise: the pricing of each placement (pure, with made-up prices) and
the measuring pieces, run on fake models; no real model loads here."""

from __future__ import annotations

import argparse
import os
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bench import advice, advise, prompts
from bench.fake import FakeModel
from bench.ideal import free_draft_bound, padded

SIZES = list(range(1, 10))
FLAT = {b: 0.030 for b in SIZES}  # a GPU-like target: a batch costs what one token costs
LINEAR = {b: 0.030 * b for b in SIZES}  # a CPU-bound one: every token costs the same


def measured(every: dict[int, float], split_costs: dict[int, float] | None, alpha: float = 0.8,
             draft_s: float = 0.005) -> advice.Measured:
    split = None if split_costs is None else advice.Split("0", "1", split_costs[1],
                                                          split_costs, draft_s)
    return advice.Measured(every, 2, alpha, draft_s, 8, split)


def by_name(rows: list[advice.Outlook]) -> dict[str, advice.Outlook]:
    return {r.placement.split(":")[0].split(" (")[0]: r for r in rows}


def test_a_flat_verify_cost_recommends_a_back_beside_lead() -> None:
    shared = {b: 0.040 for b in SIZES}  # one core of two: slower, still flat
    m = measured(FLAT, shared)
    rows = advice.outlooks(m)
    split = by_name(rows)["duo split"]
    assert split.speed > advice.PAYS and "best k=" in split.why
    assert advice.recommend(m, rows).startswith("split this CPU: lead with --cpus 0")


def test_a_linear_verify_cost_recommends_lead_on_every_core() -> None:
    m = measured(LINEAR, {b: 0.040 * b for b in SIZES})
    rows = advice.outlooks(m)
    named = by_name(rows)
    assert named["lead alone, every core"].speed == 1.0
    assert named["lead alone on CPU 0"].speed == pytest.approx(0.75)
    # nothing pays, so lead decodes alone on its share: the split is that share's speed
    assert named["duo split"].speed == pytest.approx(0.75)
    assert "lead verifies nothing" in named["duo split"].why
    line = advice.recommend(m, rows)
    assert line.startswith("give lead every core") and "does not pay (split: 0.75x)" in line
    assert "even free drafts would give 1.00x" in line


def test_a_draft_elsewhere_is_recommended_where_only_it_pays() -> None:
    # every core: batches are cheap; one core of two: dear, and the draft beside is slow
    every = {b: 0.030 * (1 + 0.1 * (b - 1)) for b in SIZES}
    m = measured(every, {b: 0.060 * b for b in SIZES}, draft_s=0.050)
    rows = advice.outlooks(m)
    free = by_name(rows)["duo, draft on another device, free"]
    assert free.speed == pytest.approx(free_draft_bound(padded(every), 0.8, 8)[0])
    line = advice.recommend(m, rows)
    assert line.startswith("give lead every core") and "a back on this CPU does not pay" in line
    assert f"a draft on another device could give up to ~{free.speed:.2f}x" in line


def test_one_cpu_has_no_split_to_price() -> None:
    m = measured(FLAT, None)
    rows = advice.outlooks(m)
    assert not any("split" in r.placement for r in rows)
    assert "one CPU: nothing to split" in advice.recommend(m, rows)


def test_the_report_gives_every_placement_its_reason_and_ends_with_the_advice() -> None:
    text = advice.report(measured(LINEAR, {b: 0.040 * b for b in SIZES}), 4, 256)
    table = [line for line in text.splitlines() if line.startswith("| ") and "x |" in line]
    assert len(table) == 5 and all(line.count("|") == 4 for line in table)
    assert text.splitlines()[-1].startswith("recommendation: give lead every core")
    assert "b=2 2.00x" in text and "4 prompts, 256 tokens" in text


def test_cpu_lists_read_as_one_or_many() -> None:
    assert advice.cpus("0") == "CPU 0" and advice.cpus("2-3") == "CPUs 2-3"


# --- the measuring pieces, on fakes ---
class Fake(FakeModel):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_every_core_measures_replies_costs_and_agreement_on_fakes() -> None:
    made: list[Fake] = []

    def loader(**kw: object) -> Callable[[], Fake]:
        def load() -> Fake:
            made.append(Fake(eos_bias=-100.0, **kw))  # type: ignore[arg-type]
            return made[-1]
        return load

    got = advise.every_core(loader(), loader(agree=0.5, agree_salt="target", salt="draft"),
                            ["def f(x):", "explain"], 40, SIZES)
    target = made[0]
    for ids, agrees in zip(got["ids"], got["agrees"], strict=True):
        reply = target.greedy_continuation(ids, 40)
        assert len(agrees) == len(reply) == 40
    share = np.mean([x for a in got["agrees"] for x in a])
    assert 0.2 < share < 0.8  # a draft agreeing half the time, not always or never
    assert set(got["costs"]) == set(SIZES) and got["draft_s"] >= 0
    assert all(m.closed for m in made)


def test_every_core_refuses_a_draft_with_another_token_table() -> None:
    with pytest.raises(advise.AdviseError, match="another token table"):
        advise.every_core(lambda: Fake(), lambda: Fake(n_vocab=120), ["hi"], 4, [1, 2])


def test_greedy_reply_is_the_models_own_continuation_and_stops_at_its_end() -> None:
    model = Fake(eos_bias=-100.0)
    prompt = model.tokenize("write a loop")
    assert advise.greedy_reply(model, prompt, 30) == model.greedy_continuation(prompt, 30)
    ending = Fake(eos_bias=100.0)  # end of generation first
    assert advise.greedy_reply(ending, prompt, 30) == [0]


def test_step_costs_leave_the_cache_as_the_prompt_left_it() -> None:
    model = Fake()
    prompt = model.tokenize("abc")
    costs = advise.step_costs(model, prompt, SIZES, passes=2, one_token=3)
    assert set(costs) == set(SIZES) and model.cached == prompt
    assert model.calls.count(1) == 3 and model.calls.count(9) == 2


def test_the_split_times_the_target_beside_a_drafting_back() -> None:
    alone, drafting, done = threading.Event(), threading.Event(), threading.Event()
    draft = Fake(salt="draft")
    result: list[float] = []
    back = threading.Thread(target=lambda: result.append(advise.back_share(
        lambda: draft, [1, 2, 3], drafting, done)))
    back.start()
    quiet, busy = advise.lead_share(Fake, [1, 2, 3], SIZES, alone, drafting, done)
    back.join(30)
    assert alone.is_set() and done.is_set() and set(busy) == set(SIZES) and quiet >= 0
    assert draft.calls.count(1) >= 1 and result[0] >= 0 and draft.closed


def test_split_cpus_are_the_first_half_and_the_rest_unless_named() -> None:
    a = argparse.Namespace(lead_cpus=None, back_cpus=None)
    assert advise.split_cpus(a, frozenset({0, 1, 2, 3})) == ("0-1", "2-3")
    assert advise.split_cpus(a, frozenset({5})) is None
    named = argparse.Namespace(lead_cpus="3", back_cpus=None)
    assert advise.split_cpus(named, frozenset({0, 1, 2, 3})) == ("3", "0-2")


def test_a_sample_of_prompts_holds_every_kind() -> None:
    sample = prompts.spread(prompts.load(), 4)
    assert [p["kind"] for p in sample] == ["code", "explain", "edit", "code"]


# --- the measuring processes ---
def test_a_model_that_fails_to_load_ends_in_an_error_naming_the_measurement(
        tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a model")
    child = advise._start(None, advise.every_core, advise.Loader(bad, 1),
                          advise.Loader(bad, 1), ["hi"], 4, [1, 2])
    with pytest.raises(advise.AdviseError, match="the every-core measurement: ModelError: "
                       "cannot load"):
        advise._result(*child, "the every-core measurement")


def test_a_measuring_process_that_dies_is_reported_with_its_exit_code() -> None:
    child = advise._start(None, os._exit, 3)
    with pytest.raises(advise.AdviseError, match=r"ended without an answer \(exit code 3\)"):
        advise._result(*child, "a measurement")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_measuring_process_runs_on_the_cpus_it_is_given() -> None:
    first = min(os.sched_getaffinity(0))
    child = advise._start(frozenset({first}), os.sched_getaffinity, 0)
    assert advise._result(*child, "affinity") == {first}


def test_unknown_models_end_in_a_one_line_error_before_any_process_starts() -> None:
    from bench.__main__ import main

    with pytest.raises(SystemExit) as stop:
        main(["--advise", "--target", "no-such-model"])
    assert str(stop.value.code).startswith("python -m bench: error: model 'no-such-model'")

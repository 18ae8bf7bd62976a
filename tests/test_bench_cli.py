"""Bad benchmark arguments end in a one-line error, before any model loads."""

from __future__ import annotations

import pytest

from bench.__main__ import main, parse


@pytest.mark.parametrize(("argv", "message"), [
    (["--sweep", "1,x"], "not a list of integers"),
    (["--sweep", "0"], "draft lengths must be 1..64"),
    (["--sim", "--sim-target", "abc"], "not seconds"),
    (["--sim", "--sim-target", "0.1"], "CALL,TOKEN"),
    (["--sim-draft", "-1"], "seconds must be in"),
    (["--sim-agree", "2"], "a share in [0, 1]"),
    (["--tokens", "1"], "--tokens at least 2"),
    (["--sweep-prompts", "0"], "--sweep-prompts must be at least 1"),
    (["--lead-cpus", "3-1"], "not a CPU list"),
])
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_parse_to_usable_values() -> None:
    a = parse([])
    assert a.sweep == "1,2,3,4,6,8,12,16" and a.sim_target == [0.03, 0.0005]
    assert a.sim_draft == [0.003] and parse(["--sweep", ""]).sweep == ""


def test_unknown_model_is_a_one_line_error() -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--target", "no-such-model", "--no-peers"])
    assert str(stop.value.code).startswith("python -m bench: error: model 'no-such-model'")


def test_the_default_placement_is_what_users_run() -> None:
    import os

    a = parse([])
    assert a.lead_cpus is None and a.back_cpus is None  # no --cpus flags: roles decide
    assert a.loop_threads == len(os.sched_getaffinity(0))  # the raw loop runs as lead does
    assert a.back_sits_out  # lead holds every CPU of the host


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_pinned_placement_pins_lead_and_leaves_the_back_the_rest() -> None:
    import os

    cpus = sorted(os.sched_getaffinity(0))
    a = parse(["--placement", "pinned"])
    lead = set(cpus[: len(cpus) // 2])
    assert a.lead_cpus is not None and a.back_cpus is None  # the back chooses, as in make run
    assert a.loop_threads == len(lead) and not a.back_sits_out
    assert a.draft_cpus is not None and str(cpus[-1]) in a.draft_cpus

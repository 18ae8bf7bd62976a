"""python -m bench.structured without a model: its tables from fake numbers, its replies'
validation, its prompts (each a schema lead enforces in strict mode) and its CLI."""

from __future__ import annotations

import os

import jsonschema
import pytest

from bench.structured import (
    ALONE,
    BLIND,
    CASES,
    UNDER,
    Reply,
    body,
    parse,
    per_case,
    show,
    table,
    valid,
)
from shared.grammar.schema_keywords import unenforced


def _results() -> dict[str, list[Reply]]:
    """Two prompts per configuration; numbers chosen so every figure is round."""
    def reply(config: str, prompt: int, tokens: int, decode_s: float, drafted: int = 0,
              accepted: int = 0, text: str = "{}", ok: bool = True) -> Reply:
        return Reply(config, prompt, tokens, decode_s, 0.2, drafted, accepted, text=text,
                     wall_s=decode_s + 0.2, valid=ok, cut=tokens >= 21)
    return {
        ALONE: [reply(ALONE, 0, 11, 1.0), reply(ALONE, 1, 21, 2.0)],
        UNDER: [reply(UNDER, 0, 11, 0.5, 8, 6), reply(UNDER, 1, 21, 1.0, 12, 9)],
        BLIND: [reply(BLIND, 0, 11, 0.8, 10, 5),
                reply(BLIND, 1, 21, 1.7, 0, 0, text="{\"x\"", ok=False)],
    }


def test_the_table_totals_each_configuration_and_compares_it_with_lead_alone() -> None:
    lines = table(_results(), ALONE).splitlines()
    assert lines[0].startswith("| config | replies | invalid | cut | tokens | decode s |")
    assert lines[2] == ("| lead alone | 2 | 0 | 1 | 32 | 3.00 | 3.40 | 10.00 | 1.00x | 0 | 0 "
                        "| - | - |")
    # 30 tokens after the first ones in 1.5 s: 20 tok/s; 15 of 20 drafted accepted
    assert lines[3] == ("| duo: back under the grammar | 2 | 0 | 1 | 32 | 1.50 | 1.90 | 20.00 "
                        "| 2.00x | 20 | 15 | 75% | 0 of 2 prompts |")
    assert lines[4] == ("| duo: back blind | 2 | 1 | 1 | 32 | 2.50 | 2.90 | 12.00 | 1.20x | "
                        "10 | 5 | 50% | 1 of 2 prompts |")


def test_the_per_case_table_sets_each_back_against_lead_alone() -> None:
    lines = per_case(_results(), ALONE, [UNDER, BLIND]).splitlines()
    assert lines[0] == ("| case | lead alone tok/s | duo: back under the grammar | "
                        "duo: back blind |")
    assert lines[2] == f"| {CASES[0].name} | 10.00 | 2.00x, 75% of 8 | 1.25x, 50% of 10 |"
    assert lines[3] == f"| {CASES[1].name} | 10.00 | 2.00x, 75% of 12 | 1.18x, none drafted |"


def test_a_run_prints_its_invalid_replies_and_why_its_backs_sat_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    a = parse([])  # default placement: lead on every core, the back sits out
    show(a, _results(), 0.3)
    out = capsys.readouterr().out
    assert "invalid replies: 1 (expected 0)" in out
    assert "the backs sit out in this placement" in out
    assert "other processes used 30%" in out


def test_a_reply_is_valid_only_if_it_parses_and_fits_the_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert valid('{"n": 3}', schema)
    assert not valid('{"n": "3"}', schema) and not valid("{}", schema)
    assert not valid('{"n": 3', schema) and not valid("", schema)  # cut short


def test_every_prompt_asks_for_a_schema_lead_enforces_in_strict_mode() -> None:
    assert 6 <= len(CASES) <= 10 and len({c.name for c in CASES}) == len(CASES)
    for case in CASES:
        jsonschema.Draft202012Validator.check_schema(case.schema)
        assert unenforced(case.schema) is None, case.name  # else lead answers 400
        request = body(case, 200)
        assert request["temperature"] == 0 and request["stream"] and \
            request["max_tokens"] == 200
        assert request["response_format"] == {"type": "json_schema", "json_schema": {
            "name": case.name, "schema": case.schema, "strict": True}}
    kinds = {str(prop.get("type", "enum" if "enum" in prop else ""))
             for case in CASES for prop in case.schema["properties"].values()}
    assert {"string", "integer", "enum", "array", "object"} <= kinds


def test_help_names_the_configurations_and_placements(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(["--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "python -m bench.structured" in out and "--blind" in out
    assert "--placement {default,pinned}" in out and "--quick" in out


def test_quick_uses_smollm2_for_both_roles_and_bad_counts_are_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    a = parse(["--quick"])
    assert (a.target, a.draft, a.repeat, a.max_tokens) == ("smollm2-135m", "smollm2-135m",
                                                           1, 200)
    assert parse([]).target == "qwen2.5-coder-1.5b"
    for argv in (["--repeat", "0"], ["--max-tokens", "1"]):
        with pytest.raises(SystemExit) as stop:
            parse(argv)
        assert stop.value.code == 2
    assert "--repeat must be at least 1" in capsys.readouterr().err


def test_the_default_placement_passes_no_flags() -> None:
    a = parse([])
    assert (a.lead_cpus, a.back_cpus, a.lead_threads, a.back_threads) == (None, None, 0, 0)
    assert a.back_sits_out  # lead holds every CPU of the host


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_pinned_placement_gives_lead_and_back_one_cpu_and_one_thread_each() -> None:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    a = parse(["--placement", "pinned"])
    assert (a.lead_cpus, a.back_cpus) == (str(first), str(second))
    assert (a.lead_threads, a.back_threads) == (1, 1) and not a.back_sits_out
    assert f"CPUs {first}" in a.lead_where and f"CPUs {second}" in a.back_where

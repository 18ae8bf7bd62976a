"""The benchmark without a real model: bad arguments end in a one-line error before any
model loads; the pieces around the measurements (prompts, plot, timing, load) work."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.__main__ import main, parse
from bench.procs import SimLead


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
    (["--cover", "1.5"], "a share in [0, 1]"),
    (["--cover", "half"], "not a number"),
    (["--sync-k", "-1"], "--sync-k must be at least 1"),
    (["--sync-k", "0"], "--sync-k must be at least 1"),
    (["--lead-variant=--bogus"], "--lead-variant=--bogus: unrecognized arguments: --bogus"),
    (["--lead-variant", "--flash-attn maybe"], "flash-attn"),
    (["--lead-variant", "--draft-len 'x"], "No closing quotation"),
    (["--sim", "--sim-tree", "4"], "--sim-tree was removed with lead-side trees"),
])
def test_bad_arguments_are_one_line_errors(argv: list[str], message: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(argv)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def test_defaults_parse_to_usable_values() -> None:
    from bench.coverage import MEASURED_COVER

    a = parse([])
    assert a.sweep == "1,2,3,4,6,8,12,16" and a.sim_target == [0.03, 0.0005]
    assert a.sim_draft == [0.003] and parse(["--sweep", ""]).sweep == ""
    assert a.cover == MEASURED_COVER and 0 < a.cover < 1


def test_the_simulated_draft_covers_what_the_ideal_is_priced_at() -> None:
    from bench.__main__ import sim_flags

    target, draft = sim_flags(parse(["--sim", "--cover", "0.3", "--sim-agree", "0.7"]))
    assert target[:4] == ["--call-s", "0.03", "--token-s", "0.0005"]
    assert draft == ["--call-s", "0.003", "--agree", "0.7", "--cover", "0.3", "--branches", "8"]
    assert sim_flags(parse(["--sim", "--sim-branches", "2"]))[1][-2:] == ["--branches", "2"]
    # by default as many as a back grows: python -m bench --sim measures what users get
    from back.settings import BackSettings
    assert parse(["--sim"]).sim_branches == BackSettings().branches


def test_quick_sets_its_own_defaults_but_keeps_what_the_user_gave() -> None:
    quick = parse(["--quick"])
    assert (quick.target, quick.prompts, quick.tokens, quick.sweep, quick.sweep_prompts) == \
        ("smollm2-135m", 2, 24, "1,4", 1)
    given = parse(["--quick", "--sweep", "", "--tokens", "40", "--prompts", "3",
                   "--sweep-prompts", "2"])
    assert (given.sweep, given.tokens, given.prompts, given.sweep_prompts) == ("", 40, 3, 2)


def test_a_lead_variant_is_lead_alone_with_its_flags_beside_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import ExitStack

    from bench import configs

    started: list[list[str]] = []
    monkeypatch.setattr(configs, "start_lead", lambda a, stack, extra: started.append(extra))
    a = parse(["--lead-variant=--flash-attn off", "--lead-variant", "--max-draft 4"])
    with ExitStack() as stack:
        runners = configs.variants(a, stack, [{"text": "hi"}])
    assert started == [["--flash-attn", "off"], ["--max-draft", "4"]]
    assert list(runners) == ["lead alone, --flash-attn off", "lead alone, --max-draft 4"]
    assert parse([]).lead_variant == []


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


# --- the pieces around the measurements, without a real model ---
def test_the_prompts_ship_with_the_package() -> None:
    import tomllib

    from bench import prompts
    from bench.procs import ROOT

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    assert "prompts.json" in package_data["bench"]  # so a wheel holds what load() reads
    loaded = prompts.load()  # through importlib.resources: the package, not the checkout
    assert len(loaded) == 8 and all(p["text"] and p["kind"] for p in loaded)


def _sim_data() -> dict:
    from bench.runs import Result

    def reply(config: str, seconds: float, **counts: int) -> list[Result]:
        return [Result(config, 0, 40, seconds, 0.1, text="same", **counts)]
    duo = reply("duo", 0.8, drafted=30, accepted=24, steps=16, rejections=6,
                after_rejection=5, ready_after_rejection=2)
    return {"results": {"SIM lead alone": reply("alone", 1.0), "SIM duo: lead + back": duo},
            "costs": {b: 0.03 + 0.0005 * b for b in range(1, 18)}, "draft_s": 0.003,
            "gauges": {}, "sweep": {"1": (10.0, 9.0), "auto": (11.0, 9.0)}}


def test_without_matplotlib_the_run_says_so_and_writes_its_figures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import show

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    show(parse(["--sim", "--out", str(tmp_path)]), _sim_data(), tmp_path)
    out = capsys.readouterr().out
    assert "no sweep.png: matplotlib is not installed (pip install 'duo[bench]')" in out
    assert f"wrote {tmp_path}/sim.json\n" in out and "| 1 | 10.00 | 9.00 | 1.11x |" in out
    assert json.loads((tmp_path / "sim.json").read_text())["sweep"]["1"] == [10.0, 9.0]
    assert not (tmp_path / "sweep.png").exists()


def test_the_report_sets_duo_against_the_ideal_with_branches(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import show
    from bench.ideal import async_ideal, branch_ideal, padded

    data = _sim_data()
    show(parse(["--sim", "--cover", "0.6", "--out", str(tmp_path)]), data, tmp_path)
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "sim.json").read_text())
    cost = padded(data["costs"])
    assert saved["alpha"] == 0.8 and saved["cover"] == 0.6  # 24 / (24 + 6)
    assert saved["branch_bound"] == branch_ideal(cost, 0.8, 0.003, 8, 0.6)[0]
    assert saved["bound"] == async_ideal(cost, 0.8, 0.003, 8)[0] < saved["branch_bound"]
    assert saved["branch_bound"] <= saved["free_bound"]
    assert "with a branch ready after 60% of rejections (--cover): " \
        f"{saved['branch_bound']:.2f}x" in out
    assert f", {saved['speedup'] / saved['branch_bound']:.2f} of the ideal with branches" in out
    assert saved["branch_bound_per_prompt"] == pytest.approx(saved["branch_bound"])
    # lead counted 5 steps after a rejection, 2 of which found a draft ready
    assert saved["ready_after_rejection"] == 0.4
    assert "steps after a rejection that found a draft ready (duo): 40%" in out
    assert "| ready after rejection |" in out and "| 0/1 | 40% |" in out
    assert "| SIM lead alone | 39.00 | 1.00x | - | - | 0.10 | 0/1 | - |" in out
    assert "back sits out" not in out  # the placement of real models: not --sim's


def test_ready_after_rejection_is_a_dash_where_lead_does_not_count_it() -> None:
    from bench.report import markdown, summarise
    from bench.runs import Result, counted_since

    assert counted_since({}, {"duo_ready_after_rejection_total": 3.0},
                         "duo_ready_after_rejection_total") == 3
    assert counted_since({"duo_x_total": 1.0}, {"duo_x_total": 4.0}, "duo_x_total") == 3
    assert counted_since({}, {"duo_verify_steps_total": 9.0}, "duo_x_total") is None
    older = [Result("old", 0, 40, 1.0, 0.1, steps=20, rejections=5)]
    pooled = [Result("new", p, 40, 1.0, 0.1, after_rejection=n, ready_after_rejection=r)
              for p, (n, r) in enumerate([(4, 3), (0, 0), (6, 2)])]
    assert summarise("old", older, None).ready_after_rejection is None
    assert summarise("new", pooled, None).ready_after_rejection == 0.5  # (3 + 2) / (4 + 6)
    table = markdown([summarise("old", older, None), summarise("new", pooled, None)], "old")
    assert table.splitlines()[2].endswith("| - | - |")
    assert table.splitlines()[3].endswith("| - | 50% |")


def test_every_figure_is_set_against_both_llama_servers_and_the_prefill_rate() -> None:
    from bench.llamaserver import PLAIN, SPEC_DEFAULT
    from bench.report import markdown, prefill_line, summarise
    from bench.runs import Result

    def reply(config: str, decode_s: float) -> Result:  # 41 tokens: 40 after the first
        return Result(config, 0, 41, decode_s, ttft_s=2.0, prompt_tokens=300)

    summaries = [summarise(c, [reply(c, s)], None)
                 for c, s in (("lead", 1.0), (PLAIN, 4.0), (SPEC_DEFAULT, 2.0))]
    table = markdown(summaries, "lead", (PLAIN, SPEC_DEFAULT)).splitlines()
    assert "| vs lead alone | vs llama-server (its defaults) | vs llama-server --spec-default |" \
        in table[0]
    assert table[2].startswith("| lead | 40.00 | 1.00x | 4.00x | 2.00x |")
    line = prefill_line([reply("lead", 1.0)], summaries)  # 300 tokens in 2 s
    assert line is not None and "150.0 tok/s" in line
    assert "lead 0.27, peer: llama-server (its defaults) 0.07" in line
    assert prefill_line([Result("lead", 0, 41, 1.0, 2.0)], summaries) is None  # not counted


def test_with_matplotlib_the_sweep_is_plotted(tmp_path: Path) -> None:
    from bench.report import plot_sweep

    assert plot_sweep(tmp_path / "sweep.png", _sim_data()["sweep"], "fake")
    assert (tmp_path / "sweep.png").read_bytes()[:4] == b"\x89PNG"


def test_the_raw_loop_is_set_against_lead_like_for_like() -> None:
    from bench.configs import LEAD_ALONE, LEAD_UNSTREAMED, RAW
    from bench.report import client_note

    note = client_note({RAW: 100.0, LEAD_UNSTREAMED: 96.0, LEAD_ALONE: 90.0})
    assert note is not None
    assert note.startswith("lead alone against the raw loop: 0.96x like for like (not "
                           "streamed")
    assert "0.90x streamed to this benchmark's client" in note
    assert client_note({RAW: 100.0, LEAD_ALONE: 90.0}) is None  # (--sim: no raw loop)


def test_lead_decode_seconds_come_from_its_own_counters() -> None:
    from bench.runs import lead_decode_s

    assert lead_decode_s({"duo_generated_tokens_total": 120,
                          "duo_decode_tokens_per_second": 40}) == 3.0
    assert lead_decode_s({"duo_generated_tokens_total": 0,
                          "duo_decode_tokens_per_second": 0}) == 0.0


@pytest.fixture(scope="module")
def sim_lead() -> Iterator[SimLead]:
    lead = SimLead(None, "--call-s", "0.002", "--token-s", "0")
    yield lead
    lead.stop()


def test_a_reply_streamed_and_not_reads_the_same(sim_lead: SimLead) -> None:
    from bench.runs import via_lead

    streamed = via_lead("streamed", sim_lead, 0, "write a loop", 20)
    whole = via_lead("whole", sim_lead, 0, "write a loop", 20, stream=False)
    assert streamed.tokens == whole.tokens == 20 and streamed.text == whole.text != ""
    assert streamed.steps == whole.steps == 20  # lead's counters, read around each reply
    assert streamed.decode_s > 0 and whole.decode_s > 0 and whole.ttft_s >= 0


def test_other_processes_cpu_time_is_read_from_proc() -> None:
    from bench.cpuwatch import caveat, foreign_share, machine_busy_ticks, parse_stat

    parent, ticks = parse_stat("42 (a (b) c) S 7 1 1 0 -1 0 0 0 0 0 11 12 13 14 20 0 1 0")
    assert parent == 7 and ticks == [11, 12, 13, 14]
    assert machine_busy_ticks("cpu  10 1 5 100 7 2 3 4 0 0\ncpu0 1 2 3") == 25
    assert foreign_share(busy_s=3.0, ours_s=1.0, wall_s=2.0, n_cpus=2) == 0.5
    assert foreign_share(busy_s=1.0, ours_s=3.0, wall_s=2.0, n_cpus=2) == 0.0
    assert caveat(0.03) is None and caveat(None) is None
    assert "other processes used 30% of this machine's CPU time" in str(caveat(0.3))


def test_a_child_counts_as_ours() -> None:
    import subprocess

    from bench.cpuwatch import _our_ticks

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        assert child.pid in _our_ticks() and os.getpid() in _our_ticks()
    finally:
        child.communicate(b"")


# --- the edit workload ---
def test_the_edit_workload_is_whole_files_in_several_languages() -> None:
    from bench import prompts

    edits = prompts.load("edit")
    assert len(edits) >= 8 and len({e["lang"] for e in edits}) >= 8
    for e in edits:
        # ~3.3-4.3 characters per token of the default target's tokenizer on this code
        # (tests/test_bench.py counts the real tokens): 1,700 characters is 395+ tokens
        assert len(e["code"]) >= 1700 and e["code"].count("\n") >= 60, e["file"]
        assert e["text"].startswith(e["task"]) and e["code"] in e["text"]
        assert "whole file" in e["text"] and e["kind"] == "edit"
    assert len({e["task"] for e in edits}) == len(edits)  # one change each, all different


def test_the_edit_workload_ships_with_the_package() -> None:
    import tomllib

    from bench.procs import ROOT

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]
    assert "edits.json" in package_data["bench"]  # so a wheel holds what load("edit") reads


def test_the_edit_workload_decodes_the_whole_file_and_skips_the_sweep() -> None:
    from bench import prompts

    a = parse(["--workload", "edit"])
    assert (a.tokens, a.sweep, a.prompts) == (prompts.EDIT_TOKENS, "", len(prompts.load("edit")))
    given = parse(["--workload", "edit", "--tokens", "100", "--sweep", "4", "--prompts", "2"])
    assert (given.tokens, given.sweep, given.prompts) == (100, "4", 2)
    assert parse([]).workload == "bench" and parse(["--quick"]).tokens == 24
    with pytest.raises(SystemExit):
        parse(["--workload", "essay"])


def test_the_load_benchmark_runs_each_lead_variant_beside_the_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import ExitStack

    from bench import load

    class FakeLead:
        made: list[tuple[str, ...]] = []

        def __init__(self, *args: str) -> None:
            FakeLead.made.append(args)
            self.url = f"http://lead{len(FakeLead.made)}"

        def stop(self) -> None:
            pass

    monkeypatch.setattr(load, "Lead", FakeLead)
    a = load.parse(["--llama-server", "", "--lead-variant", "--flash-attn off"])
    with ExitStack() as stack:
        urls = load.start(a, stack)
    assert list(urls) == ["duo lead (its defaults)", "duo lead, --flash-attn off"]
    assert FakeLead.made[1][-2:] == ("--flash-attn", "off")
    assert "--flash-attn" not in FakeLead.made[0]
    assert "--ngram-memory" not in FakeLead.made[0]  # as users start it: it remembers replies


def test_the_load_benchmark_sets_lead_beside_both_llama_servers_on_four_slots(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from contextlib import ExitStack

    from bench import llamaserver, load, prompts

    made: list[list[str]] = []

    class Fake:
        def __init__(self, *args: object) -> None:
            made.append([str(x) for x in (args[1] if len(args) > 1 else args)])
            self.url = f"http://server{len(made)}"

        def stop(self) -> None:
            pass

    server = tmp_path / "llama-server"
    server.write_text("#!/bin/sh\n")
    server.chmod(0o755)
    monkeypatch.setattr(load, "Lead", Fake)
    monkeypatch.setattr(llamaserver, "LlamaServer", Fake)
    a = load.parse(["--workload", "edit", "--llama-server", str(server)])
    assert (a.levels, a.tokens) == ([1, 4], prompts.EDIT_TOKENS)
    with ExitStack() as stack:
        urls = load.start(a, stack)
    assert list(urls)[1:] == [llamaserver.PLAIN, llamaserver.SPEC_DEFAULT]
    plain, spec = made[1], made[2]
    assert "--spec-default" in spec and "--spec-default" not in plain
    assert all(args[args.index("-np") + 1] == "4" for args in (plain, spec))
    with pytest.raises(SystemExit):
        load.parse(["--workload", "edit", "--sim"])


def test_the_load_report_sets_each_rate_against_the_n_gram_peer_and_its_own_prefill() -> None:
    from bench import llamaserver, load

    def samples(config: str, tokens: int) -> list[load.Sample]:  # 2 clients over 2 s
        return [load.Sample(config, 2, tokens, 0.1, 2.0, 0.0, 2.0) for _ in range(2)]

    lead, spec = "duo lead (its defaults)", llamaserver.SPEC_DEFAULT
    data = {"results": {lead: {2: samples(lead, 60)}, spec: {2: samples(spec, 40)},
                        llamaserver.PLAIN: {2: samples(llamaserver.PLAIN, 20)}},
            "latencies": {}, "foreign_cpu": None, "prefill": {lead: 120.0, spec: 80.0}}
    a = load.parse(["--levels", "2", "--llama-server", ""])
    rows = {line.split(" | ")[1]: line for line in load.report(a, data).splitlines()
            if line.startswith("| 2 |")}
    assert "| 60.0 | 1.50x | 0.50 |" in rows[lead]  # 120 tokens in 2 s; 40 tok/s; of 120
    assert "| 40.0 | 1.00x | 0.50 |" in rows[spec]
    assert "| 20.0 | 0.50x | - |" in rows[llamaserver.PLAIN]
    assert "n-gram pool" not in load.report(a, data)  # no prompt sent twice
    again = load.parse(["--levels", "2", "--llama-server", "", "--repeat", "5"])  # 10 of 8
    note = load.report(again, data)
    assert "one n-gram pool for all requests" in note and "its memory of replies" in note


def test_the_prefill_probe_asks_one_token_and_counts_the_prompts_tokens() -> None:
    import asyncio

    import httpx

    from bench.load import prefill_rate

    asked: list[dict] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(json.loads(request.content))
        return httpx.Response(200, json={"usage": {"prompt_tokens": 500}})

    async def probe() -> float:
        transport = httpx.MockTransport(answer)
        async with httpx.AsyncClient(transport=transport, base_url="http://x") as http:
            return await prefill_rate(http, "a file", iter([10.0, 12.5]).__next__)
    assert asyncio.run(probe()) == 200.0  # 500 tokens in 2.5 s
    assert asked[0]["max_tokens"] == 1 and asked[0]["messages"][0]["content"] == "a file"


def test_the_simulated_long_reply_is_never_the_short_requests_prompt() -> None:
    from bench import prompts
    from bench.load import long_prompts

    texts = [p["text"] for p in prompts.load()]
    longs = long_prompts(texts, sim=True)
    assert sorted(longs) == sorted(texts)
    assert all(longs[r % len(longs)] != texts[r % len(texts)] for r in range(16))
    assert long_prompts(texts, sim=False) == [p["text"] for p in prompts.load("edit")]


def test_each_request_of_the_load_benchmark_gets_a_prompt_not_sent_before_while_any_is_left(
        ) -> None:
    from bench.load import sent

    files = [f"file {i}" for i in range(9)]
    asked = [t for r in range(2) for n in (1, 4) for t in sent(files, [1, 4], r, n)]
    assert len(asked) == 10 and len(set(asked)) == 9  # nine files: one sent twice, no more
    assert all(len(set(sent(files, [1, 4], r, 4))) == 4 for r in range(3))
    assert sent(files, [1, 4], 0, 1) == ["file 0"] and sent(files, [1, 4], 1, 1) == ["file 5"]


def test_with_rounds_repeated_the_first_round_is_shown_on_its_own(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from bench.__main__ import show
    from bench.report import FIRST_ROUND

    data = _sim_data()  # round 0; round 1 as fast again, as if drafted from round 0
    for rs in data["results"].values():
        rs.append(replace(rs[0], round=1, decode_s=rs[0].decode_s / 4))
    show(parse(["--sim", "--repeat", "2", "--out", str(tmp_path)]), data, tmp_path)
    out = capsys.readouterr().out
    pooled, first = out.split(f"First round only ({FIRST_ROUND}):")
    assert "| SIM lead alone | 62.40 | 1.00x" in pooled  # 78 tokens in 1.25 s
    assert "| SIM lead alone | 39.00 | 1.00x" in first.split("Per prompt")[0]
    assert "| SIM duo: lead + back | 48.75 | 1.25x" in first.split("Per prompt")[0]


def test_the_ideals_of_real_models_are_set_against_the_first_round_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from bench import configs
    from bench.__main__ import show

    sim = _sim_data()  # duo 1.25x lead alone in round 0; in round 1 lead alone copies its
    alone, duo = sim["results"].values()  # last reply (4x), duo not
    alone.append(replace(alone[0], round=1, decode_s=alone[0].decode_s / 4))
    duo.append(replace(duo[0], round=1))
    data = {**sim, "results": {configs.LEAD_ALONE: alone, configs.DUO_MODEL: duo}}
    show(parse(["--repeat", "2", "--out", str(tmp_path)]), data, tmp_path)
    out = capsys.readouterr().out
    assert "duo measured 1.25x" in out

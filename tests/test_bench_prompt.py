"""The benchmark's prompt workload without a real model: the recorded agent request, a turn
timed from its stream, the table against llama-server, the CLI's option, lead started with
its own defaults, and a whole run over fake servers (tests/fake_llama_server.py), each
started afresh, in alternating order. The prompt's size in real tokens: tests/test_bench.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import promptbench
from bench.__main__ import parse
from bench.promptbench import LEAD, PEER, Turn
from tests.test_bench_llamaserver import _fake_binary


def test_the_agent_prompt_is_a_recorded_request_of_about_7k_tokens() -> None:
    from importlib import resources

    prompt = promptbench.load()
    assert [m["role"] for m in prompt["messages"]] == ["system", "user"]
    assert len(prompt["tools"]) == 10 and all(t["function"]["name"] for t in prompt["tools"])
    assert prompt["next"] and "opencode" in prompt["about"]
    size = len(resources.files("bench").joinpath("agent.json").read_bytes())
    assert size < 100_000
    # 4.2-4.4 characters a token of the default target's tokenizer on this prompt (the
    # real count, 7,204 with its chat template: tests/test_bench.py): 28-34k characters
    characters = len(json.dumps(prompt["messages"])) + len(json.dumps(prompt["tools"]))
    assert 28_000 <= characters <= 34_000


def test_the_next_turn_is_the_conversation_the_reply_and_the_next_message() -> None:
    prompt = promptbench.load()
    following = promptbench.next_turn(prompt, "Hi!")
    assert following[:2] == prompt["messages"]
    assert following[2:] == [{"role": "assistant", "content": "Hi!"},
                             {"role": "user", "content": prompt["next"]}]
    body = promptbench.request(following, prompt["tools"], 8)
    assert body["temperature"] == 0 and body["stream"] and body["max_tokens"] == 8
    assert body["tools"] == prompt["tools"]


def _text(piece: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": piece}}]}


def test_a_turn_is_timed_from_sending_to_the_first_text() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 7240, "completion_tokens": 8,
                                      "prompt_tokens_details": {"cached_tokens": 7204}}}
    stamped = [(10.5, {"choices": [{"delta": {"role": "assistant", "content": None}}]}),
               (12.0, _text("Hello")), (12.3, _text("!")), (12.4, usage)]
    turn = promptbench.turn_of(PEER, "next turn", 1, stamped, t0=10.0)
    assert turn == Turn(PEER, "next turn", 1, 2.0, 7240, 7204, "Hello!")
    # a tool call's first delta counts as the reply's first text; no text at all: the end
    call = {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"name": "read"}}]}}]}
    assert promptbench.turn_of(LEAD, "cold", 0, [(11.0, call), (13.0, usage)], 10.0).ttft_s == 1.0
    held = promptbench.turn_of(LEAD, "cold", 0, [(11.0, {"choices": []}), (13.0, usage)], 10.0)
    assert (held.ttft_s, held.text, held.cached_tokens) == (3.0, "", 7204)


def test_text_lead_held_after_its_first_token_is_counted_and_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def lead_event(piece: str, tokens: int) -> dict:
        return {**_text(piece), "duo": {"tokens": tokens, "accepted": 0}}
    stamped = [(10.1, lead_event("", 0)), (11.0, lead_event("", 1)), (11.5, lead_event("", 1)),
               (13.0, lead_event("```json\n{", 1))]
    turn = promptbench.turn_of(LEAD, "same again", 0, stamped, t0=10.0)
    assert (turn.ttft_s, turn.held_s, turn.text) == (3.0, 2.0, "```json\n{")
    assert promptbench.turn_of(PEER, "cold", 0, [(11.0, _text("hi"))], 10.0).held_s == 0.0
    turns = _turns(LEAD, (50.0, 3.0, 1.0))
    turns[1].held_s = 2.0
    data = {"turns": turns, "contexts": {LEAD: 32768}, "foreign_cpu": 0.0, "notes": [],
            "about": "a recorded request"}
    promptbench.show(parse(["--workload", "prompt", "--llama-server", ""]), data, tmp_path)
    out = capsys.readouterr().out
    assert f"{LEAD}, same again, round 1: its first text came 2.00 s after its first token" in out
    assert f"tokens a generation held, as each logged it: {LEAD} 32768" in out


def _turns(server: str, seconds: tuple[float, float, float], round_: int = 0,
           tokens: int = 7200) -> list[Turn]:
    cached = (0, tokens, tokens)
    return [Turn(server, phase, round_, s, tokens + 40 * (phase == "next turn"), c, "hi")
            for phase, s, c in zip(promptbench.PHASES, seconds, cached, strict=True)]


def test_the_table_sets_each_configuration_against_llama_server_as_a_speed() -> None:
    turns = _turns(LEAD, (50.0, 0.2, 1.0)) + _turns(PEER, (60.0, 0.1, 2.0)) + \
        _turns(LEAD, (46.0, 0.2, 1.0), 1) + _turns(PEER, (60.0, 0.1, 2.0), 1)
    lines = promptbench.table(turns).splitlines()
    assert lines[0].startswith("| configuration | cold: TTFT s | same again: TTFT s |")
    # medians over the rounds: lead cold 48 s, 150 tokens a second; llama-server's
    # seconds over lead's, as a speed
    assert lines[2] == (f"| {LEAD} | 48.00 (1.25x) | 0.20 (0.50x) | 1.00 (2.00x) | "
                        "150.0 (1.25x) | 7200 / 7240 (7200) |")
    assert lines[3] == f"| {PEER} | 60.00 | 0.10 | 2.00 | 120.0 | 7200 / 7240 (7200) |"
    alone = promptbench.table(_turns(LEAD, (50.0, 0.2, 1.0))).splitlines()
    assert alone[2] == f"| {LEAD} | 50.00 | 0.20 | 1.00 | 144.0 | 7200 / 7240 (7200) |"


def test_prompts_of_different_lengths_are_said() -> None:
    same = _turns(LEAD, (50.0, 0.2, 1.0)) + _turns(PEER, (60.0, 0.1, 2.0))
    assert promptbench.unlike(same) is None
    unlike = promptbench.unlike(_turns(LEAD, (50.0, 0.2, 1.0)) +
                                _turns(PEER, (20.0, 0.1, 2.0), tokens=2209))
    assert unlike is not None and f"{LEAD} 7200, {PEER} 2209 tokens" in unlike


def test_the_prompt_workload_takes_a_few_tokens_and_no_sweep() -> None:
    a = parse(["--workload", "prompt"])
    assert (a.tokens, a.prompts, a.sweep, a.repeat) == (promptbench.TOKENS, 1, "", 1)
    given = parse(["--workload", "prompt", "--tokens", "16", "--repeat", "3"])
    assert (given.tokens, given.repeat) == (16, 3)


@pytest.mark.parametrize("extra", [["--sim"], ["--advise"]])
def test_the_prompt_workload_is_not_for_sim_or_advise(
        extra: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        parse(["--workload", "prompt", *extra])
    assert stop.value.code == 2
    assert "--workload prompt measures real servers by itself" in capsys.readouterr().err


def test_lead_starts_with_its_own_defaults_and_llama_server_with_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import llamaserver

    started: list[tuple] = []
    monkeypatch.setattr(promptbench, "Lead", lambda *args, **kw: started.append((args, kw)))
    monkeypatch.setattr(llamaserver, "LlamaServer", lambda *args: started.append(args))
    binary = _fake_binary(tmp_path)
    a = parse(["--workload", "prompt", "--llama-server", str(binary),
               "--lead-variant=--ctx-size 4096"])
    starts = promptbench.servers(a, Path("t.gguf"))
    assert list(starts) == [LEAD, "duo lead, --ctx-size 4096", PEER]
    for start in starts.values():
        start()
    # no --ctx-size, no --threads: lead chooses (sized=False: not bench's 1 thread, 2048)
    assert started[0] == (("qwen2.5-coder-1.5b",), {"sized": False})
    assert started[1] == (("qwen2.5-coder-1.5b", "--ctx-size", "4096"), {"sized": False})
    served, args, cpus = started[2]
    assert served == binary and cpus is None and "-c" not in args
    assert args[:6] == ["-m", "t.gguf", "--host", "127.0.0.1", "-t", str(a.loop_threads)]
    pinned = parse(["--workload", "prompt", "--llama-server", "", "--lead-cpus", "0",
                    "--lead-threads", "1"])
    list(promptbench.servers(pinned, Path("t.gguf")).values())[0]()
    assert started[3][0] == ("qwen2.5-coder-1.5b", "--threads", "1", "--cpus", "0")


def test_lead_without_bench_sizes_gets_no_threads_or_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import procs

    argv: list[list[str]] = []
    monkeypatch.setattr(procs.Proc, "__init__", lambda self, args, *rest: argv.append(args))
    monkeypatch.setattr(procs.Proc, "wait_serving", lambda self, *rest: "http://lead")
    procs.Lead("m", "--parallel", "2", sized=False)
    procs.Lead("m")
    assert "--ctx-size" not in argv[0] and "--threads" not in argv[0]
    assert argv[0][-2:] == ["--parallel", "2"]
    assert argv[1][-4:] == ["--threads", "1", "--ctx-size", str(procs.LEAD_CTX)]


@pytest.mark.process
def test_a_run_starts_every_server_afresh_in_alternating_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench import llamaserver
    from tests import fake_llama_server as fake

    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_SERVER_LOG", str(calls))
    binary = _fake_binary(tmp_path)

    def fake_lead(*args: str, sized: bool = True) -> llamaserver.LlamaServer:
        return llamaserver.LlamaServer(binary, ["--as-lead", *args])
    monkeypatch.setattr(promptbench, "Lead", fake_lead)
    a = parse(["--workload", "prompt", "--repeat", "2", "--llama-server", str(binary),
               "--out", str(tmp_path)])
    data = promptbench.run(a, lambda _: None)
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    starts = [c for c in logged if "argv" in c]
    assert ["--as-lead" in c["argv"] for c in starts] == [True, False, False, True]
    assert len({c["pid"] for c in starts}) == 4  # a fresh process each time
    for start in starts:  # each stopped after its turns
        with pytest.raises(ProcessLookupError):
            os.kill(start["pid"], 0)
    bodies = [c["body"] for c in logged if "body" in c]
    assert len(bodies) == 12
    prompt = promptbench.load()
    reply = "".join(fake.PIECES)
    for cold, again, following in zip(bodies[::3], bodies[1::3], bodies[2::3], strict=True):
        assert cold == again == promptbench.request(prompt["messages"], prompt["tools"], 8)
        assert following["messages"] == promptbench.next_turn(prompt, reply)
    assert [(t.server, t.phase, t.round) for t in data["turns"][:4]] == [
        (LEAD, "cold", 0), (LEAD, "same again", 0), (LEAD, "next turn", 0), (PEER, "cold", 0)]
    assert all(t.text == reply and t.ttft_s > 0 for t in data["turns"])
    promptbench.show(a, data, tmp_path)
    out = capsys.readouterr().out
    assert f"| {LEAD} |" in out and f"| {PEER} |" in out and "x) |" in out
    saved = json.loads((tmp_path / "prompt.json").read_text())
    assert len(saved["turns"]) == 12 and set(saved["medians"]) == {LEAD, PEER}
    assert saved["medians"][LEAD]["cold"] > 0


def test_the_context_each_server_held_is_read_from_its_log() -> None:
    lead = ("00:31:33.815 lead INFO model qwen2.5-coder-1.5b-instruct-q4_k_m: 151936 tokens "
            "vocabulary, context 32768; listening on http://127.0.0.1:35597")
    server = ("0.04.209.728 I srv    load_model: initializing, n_slots = 4, n_ctx_slot = 32768, "
              "kv_unified = 'true'")
    assert promptbench.context_of(f"start\n{lead}\n") == 32768
    assert promptbench.context_of(server) == 32768
    assert promptbench.context_of("nothing said") is None

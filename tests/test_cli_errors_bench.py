"""The benchmark refuses what would fail it before it runs anything, in one line: a --out it
cannot write, flags lead refuses, a model that is no GGUF file; and a lead that exits as it
starts is its one-line error, not a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import __main__ as bench
from bench.__main__ import main, parse
from bench.procs import Lead, ProcExited


def test_a_lead_variant_lead_takes_is_taken() -> None:
    assert parse(["--lead-variant=--flash-attn on"]).lead_variant == ["--flash-attn on"]


def never_run(*_: object) -> dict:
    raise AssertionError("the benchmark ran")


@pytest.mark.parametrize("out", ["/proc/nowhere/results", "a-file"])
def test_an_out_folder_that_cannot_be_made_stops_it_before_it_runs(
        out: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "run_sim", never_run)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(SystemExit) as stop:
        main(["--sim", "--prompts", "1", "--out", str(tmp_path / out)])
    assert str(stop.value.code).startswith(f"python -m bench: error: --out {tmp_path / out}")


def test_an_out_folder_is_made_before_it_runs(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "new" / "results"
    made: list[bool] = []
    monkeypatch.setattr(bench, "run_sim", lambda a: made.append(out.is_dir()) or never_run())
    with pytest.raises(AssertionError, match="ran"):
        main(["--sim", "--out", str(out)])
    assert made == [True]


def test_a_model_that_is_no_gguf_stops_it_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "run_models", never_run)
    target, draft = tmp_path / "target.gguf", tmp_path / "passwd"
    target.write_bytes(b"GGUF\x03\x00\x00\x00")
    draft.write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(SystemExit) as stop:
        main(["--target", str(target), "--draft", str(draft), "--out", str(tmp_path)])
    assert stop.value.code == f"python -m bench: error: model '{draft}' is not a GGUF file"


@pytest.mark.process
def test_a_lead_that_exits_as_it_starts_says_its_own_error() -> None:
    with pytest.raises(ProcExited) as exited:
        Lead(str(Path("/nonexistent/model.gguf")))
    said = str(exited.value)
    assert said.startswith("lead exited at start: error: model ") and "\n" not in said

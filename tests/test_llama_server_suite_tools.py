"""The pieces that run llama.cpp's server tests against lead: the launcher that maps
llama-server's argv (scripts/llama-server) and the verdict over the suite's report."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import io
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "tests" / "llama_server_suite"
REPORT = """<testsuites><testsuite>
<testcase classname="unit.test_a" name="test_ok"/>
<testcase classname="unit.test_a" name="test_words[x-1]"><failure message="m"/></testcase>
<testcase classname="unit.test_b" name="test_new"><failure message="m"/></testcase>
<testcase classname="unit.test_b" name="test_skip"><skipped/></testcase>
</testsuite></testsuites>"""


def script(path: Path) -> ModuleType:
    loader = importlib.machinery.SourceFileLoader(path.stem.replace("-", "_"), str(path))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name,
                                                                             loader))
    loader.exec_module(module)
    return module


def launcher() -> ModuleType:
    return script(ROOT / "scripts" / "llama-server")


def test_a_hub_model_becomes_a_local_preset_and_every_other_flag_goes_on() -> None:
    argv = launcher().lead_argv
    assert argv(["--port", "8080", "--hf-repo", "ggml-org/x", "--hf-file", "m.gguf", "-c",
                 "512"]) == ["--port", "8080", "-c", "512", "-m", "smollm2-135m"]
    assert argv(["-hf=ggml-org/stories-infill", "--no-jinja"])[-2:] == \
        ["-m", "qwen2.5-coder-0.5b"]  # fill in the middle: a model with FIM tokens
    assert argv(["-m", "/x.gguf", "--hf-repo", "r"]) == ["-m", "/x.gguf"]
    assert argv(["--jinja"]) == ["--jinja", "-m", "smollm2-135m"]  # router mode: no model


def verdict(tmp_path: Path, listed: str, rerun: str | None = None) -> tuple[int, str]:
    (tmp_path / "r.xml").write_text(REPORT)
    (tmp_path / "e.txt").write_text(listed)
    extra = []
    if rerun is not None:
        (tmp_path / "again.xml").write_text(rerun)
        extra = [str(tmp_path / "again.xml")]
    argv = ["verdict.py", str(tmp_path / "r.xml"), str(tmp_path / "e.txt"), *extra]
    out = io.StringIO()
    with mock.patch.object(sys, "argv", argv), redirect_stdout(out), \
            pytest.raises(SystemExit) as done:
        script(SUITE / "verdict.py").main()
    return int(done.value.code or 0), out.getvalue()


def test_the_verdict_fails_only_on_a_failure_not_listed(tmp_path: Path) -> None:
    code, said = verdict(tmp_path, "test_a.py::test_words[*  # the tiny model's words\n")
    assert code == 1 and "1 passed, 2 failed (1 of them listed" in said
    assert "FAILED, not listed: test_b.py::test_new" in said
    code, said = verdict(tmp_path, "test_a.py::test_words[x-1]  # exact\n"
                                   "test_b.py::test_new  # why\n")
    assert code == 0 and "2 failed (2 of them listed" in said
    assert verdict(tmp_path, "test_a.py::test_words[x-2]  # another\n")[0] == 1


def test_a_failure_that_passes_when_run_again_counts_as_passed(tmp_path: Path) -> None:
    again = ('<testsuites><testsuite><testcase classname="unit.test_b" name="test_new"/>'
             '</testsuite></testsuites>')
    code, said = verdict(tmp_path, "test_a.py::test_words*  # words\n", again)
    assert code == 0 and "2 passed, 1 failed" in said

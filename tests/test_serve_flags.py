"""llama-server's serving and logging flags under their names: --props, --api-key-file,
--ssl-*, --log-file, -lv, --log-disable, and -md refused naming what lead does instead."""

from __future__ import annotations

import logging
import os
import shutil
import ssl
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from bench.procs import ROOT, free_port, wait_until
from lead.__main__ import main
from lead.backs.keys import Keys
from lead.server.app import create_app
from lead.server.settings import LeadSettings
from shared.cli import parse_settings, setup_logging
from tests.conftest import chat_body, make_settings


def parse(*argv: str) -> LeadSettings:
    return parse_settings(LeadSettings, "python -m lead", "", list(argv))


def test_post_props_answers_llama_servers_501_unless_started_with_props() -> None:
    plain = TestClient(create_app(make_settings(), FakeModel()))
    refused = plain.post("/props", json={})
    assert refused.status_code == 501 and "--props" in refused.json()["error"]["message"]
    props = TestClient(create_app(make_settings(props=True), FakeModel()))
    assert props.post("/props", json={}).json() == {"success": True}
    assert props.get("/props").status_code == 200


def test_every_key_of_an_api_key_file_admits_and_no_other(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nalpha\n\nbeta\n")
    c = TestClient(create_app(make_settings(api_key_file=str(keys)), FakeModel()))
    for key, status in (("alpha", 200), ("beta", 200), ("gamma", 401), ("# team keys", 401)):
        r = c.post("/v1/chat/completions", json=chat_body(max_tokens=2),
                   headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == status, key
    assert c.post("/v1/chat/completions", json=chat_body(max_tokens=2)).status_code == 401
    assert c.get("/health").json()["api_key"] is True


def test_a_file_of_keys_trusts_no_back_without_its_first(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("alpha\nbeta\n")
    settings = make_settings(api_key_file=str(keys))
    gate = Keys(settings.first_api_key, settings.back_key, tuple(settings.api_keys()))
    assert gate.trusted_back(b"Bearer alpha") and not gate.trusted_back(b"")
    assert not gate.trusted_back(b"Bearer beta")  # an API client's key, not a back's
    assert gate.admits(b"Bearer beta", back_route=False) and not gate.admits(b"", True)


@pytest.mark.parametrize(("argv", "said"), [
    (["--api-key-file", "/nonexistent/keys"], "cannot read /nonexistent/keys"),
    (["--ssl-key-file", __file__], "--ssl-key-file and --ssl-cert-file go together"),
    (["-lv", "9"], "verbosity"),
])
def test_bad_serving_flags_are_one_line_errors(argv: list[str], said: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert said in capsys.readouterr().err


def test_a_key_file_with_a_key_no_header_can_carry_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    keys.write_text("good\nbad key\n")
    with pytest.raises(SystemExit):
        parse("--api-key-file", str(keys))
    assert "printable ASCII" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "level"), [
    ([], "info"), (["-lv", "1"], "error"), (["-lv", "2"], "warning"), (["-lv", "5"], "debug"),
    (["--log-disable"], "error"), (["--verbose"], "debug"), (["--log-level", "warning"], "warning"),
])
def test_log_levels_as_llama_server_names_them(argv: list[str], level: str) -> None:
    s = parse(*argv)
    assert s.logging_level(s.log_level, s.verbose) == level


def test_log_file_gets_the_log(tmp_path: Path) -> None:
    log_file = tmp_path / "lead.log"
    root = logging.getLogger()
    before = list(root.handlers)
    root.handlers.clear()
    try:
        setup_logging("info", str(log_file))
        logging.getLogger("lead").info("hello from lead")
        for handler in root.handlers:
            handler.flush()
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = before
    assert "hello from lead" in log_file.read_text()


def test_spec_draft_n_max_is_max_draft_and_accepted_knobs_parse() -> None:
    s = parse("--spec-draft-n-max", "12", "--no-warmup", "--threads-http", "4", "--props")
    assert (s.max_draft, s.warmup, s.threads_http, s.props) == (12, False, 4, True)


@pytest.mark.parametrize("flag", ["-md", "--model-draft", "--spec-draft-model"])
def test_a_draft_model_flag_names_the_back(flag: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main([flag, "draft.gguf"])
    assert "python -m back --lead" in capsys.readouterr().err


@pytest.mark.process
def test_ssl_flags_serve_https(tmp_path: Path) -> None:
    if shutil.which("openssl") is None:
        pytest.skip("no openssl to make a certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    made = subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes",
                           "-keyout", str(key), "-out", str(cert), "-days", "1",
                           "-subj", "/CN=127.0.0.1",
                           "-addext", "subjectAltName=IP:127.0.0.1"], capture_output=True)
    assert made.returncode == 0, made.stderr
    port = free_port()
    lead = subprocess.Popen([sys.executable, "-m", "tests.scripted_lead", "--port", str(port),
                             "--no-calibrate", "--ssl-key-file", str(key), "--ssl-cert-file",
                             str(cert)], cwd=ROOT, env={**os.environ, "SCRIPTED_RULES": "[]"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        def up() -> bool:
            assert lead.poll() is None, lead.communicate()[1][-2000:]
            try:
                trusted = ssl.create_default_context(cafile=str(cert))
                return httpx.get(f"https://127.0.0.1:{port}/health", verify=trusted,
                                 timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 60, "lead to serve HTTPS")
        with pytest.raises(httpx.HTTPError):  # plain HTTP on that port is no answer
            httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        lead.terminate()
        lead.wait(30)


@pytest.mark.parametrize(("argv", "reasoning"), [
    ([], "auto"), (["--reasoning-budget", "-1"], "auto"), (["--reasoning-budget", "0"], "off"),
    (["--chat-template-kwargs", '{"enable_thinking": false}'], "off"),
    (["--chat-template-kwargs", '{"enable_thinking": true}'], "on"),
])
def test_llama_servers_other_reasoning_switches(argv: list[str], reasoning: str) -> None:
    assert parse(*argv).reasoning == reasoning


@pytest.mark.parametrize(("argv", "said"), [
    (["--reasoning-budget", "512"], "lead ends no reasoning at a token budget"),
    (["--chat-template-kwargs", '{"custom": 1}'], "enable_thinking (true or false) only"),
    (["--chat-template-kwargs", "[1]"], "a JSON object"),
    (["--chat-template-kwargs", "{"], "not JSON"),
])
def test_reasoning_switches_lead_cannot_honour_are_one_line_errors(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert said in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    (["--mmproj", "p.gguf"], "lead serves text models"),
    (["--lora=a.gguf"], "merge it into the GGUF"),
    (["-ngld", "99"], "python -m back --lead"),
    (["--tools", "all"], "the client runs the tools it offers"),
    (["--tree"], "lead-side trees were removed"),
])
def test_llama_server_flags_for_what_lead_lacks_say_why(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["-m", "smollm2-135m", *argv])
    err = capsys.readouterr().err
    assert said in err and argv[0].split("=")[0] in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("argv", [["-nabc"], ["-ctxcp", "8"], ["--draft", "16"],
                                  ["--ctx", "4096"], ["-xyz=1"]])
def test_an_unknown_flag_is_never_read_as_another(argv: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # -nabc is not -n abc, -ctxcp not -c txcp, --draft not an abbreviated --draft-len
    with pytest.raises(SystemExit):
        parse(*argv)
    assert f"unrecognized arguments: {argv[0]}" in capsys.readouterr().err


def test_flags_lead_has_in_its_own_way_are_accepted() -> None:
    s = parse("--log-timestamps", "--no-log-prefix", "--log-colors", "off", "--no-perf",
              "--keep", "-1", "-sps", "0.5", "--cache-idle-slots", "-n", "-1", "--seed", "-1")
    assert (s.log_colors, s.perf, s.keep, s.slot_prompt_similarity) == ("off", False, -1, 0.5)
    assert s.max_tokens == 0 and s.seed is None  # negative values stay values

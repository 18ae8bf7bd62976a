"""llama-server's flags, as a service unit or script gives them, taken by lead under the
same names and meaning the same; what lead cannot honour is a one-line error naming it."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel
from bench.procs import ROOT, free_port, wait_until
from lead.server.app import create_app
from lead.server.settings import LeadSettings
from shared.cli import build_parser, parse_settings
from shared.presets import PRESETS, cache_dir
from tests.conftest import chat_body, make_settings

UNIT = ["-m", "smollm2-135m", "-c", "2048", "-np", "2", "-ngl", "99", "-fa", "off",
        "--host", "127.0.0.1", "--api-key", "s3cret", "--alias", "my-model", "--jinja",
        "-t", "1"]


def parse(*argv: str) -> LeadSettings:
    return parse_settings(LeadSettings, "python -m lead", "", list(argv))


def test_a_service_units_command_line_means_what_it_means_to_llama_server() -> None:
    s = parse(*UNIT, "--port", "8080")
    assert (s.model, s.ctx_size, s.parallel, s.n_gpu_layers, s.flash_attn) == \
        ("smollm2-135m", 2048, 2, 99, "off")
    assert (s.host, s.port, s.api_key, s.alias, s.jinja, s.threads) == \
        ("127.0.0.1", 8080, "s3cret", "my-model", True, 1)


def test_llama_servers_other_names_and_values() -> None:
    s = parse("-ngl", "all", "-fa", "-n", "-1", "-b", "256", "-ub", "128", "-tb", "2",
              "--no-mmap", "--mlock", "-to", "60", "--metrics", "--cache-reuse", "256",
              "--gpu-layers", "99", "-ts", "3,1", "-cram", "0", "--no-webui")
    assert s.n_gpu_layers == 99 and s.flash_attn == "on"  # the last -ngl; a bare -fa: on
    assert (s.max_tokens, s.batch_size, s.ubatch_size, s.threads_batch) == (0, 256, 128, 2)
    assert (s.mmap, s.mlock, s.write_timeout, s.metrics, s.webui) == (False, True, 60, True,
                                                                    False)
    assert (s.cache_reuse, s.tensor_split, s.cache_ram) == (256, "3,1", 0)
    assert parse("-ngl", "all").n_gpu_layers == -1
    assert parse("--n-predict", "64").max_tokens == 64 == parse("--predict", "64").max_tokens


@pytest.mark.parametrize(("argv", "said"), [
    (["-ngl", "auto"], "'auto' sizes offloading"),
    (["-c", "100", "-np", "4"], "--ctx-size 100 over --parallel 4 slots leaves each 25"),
    (["--no-cont-batching"], "lead always decodes its slots' generations in one batch"),
    (["--context-shift"], "lead does not shift the context"),
    (["--chat-template-file", "/nonexistent/t.jinja"], "cannot read /nonexistent/t.jinja"),
    (["-ctk", "q3_k"], "cache-type-k"),
    (["-fa", "maybe"], "flash-attn"),
])
def test_what_lead_cannot_honour_is_an_error_naming_it(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    assert exit_.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "env", "slot"), [
    (["-c", "2048", "-np", "2"], {}, 1024),  # each slot its share, as llama-server's
    (["-c", "2048"], {}, 2048),  # -np not given (llama-server's auto): -kvu, 4 slots
    (["-c", "2048"], {"LEAD_PARALLEL": "2"}, 1024),  # given in the environment
    (["-c", "2048", "-np", "2", "-kvu"], {}, 2048),
    (["-c", "2048", "--no-kv-unified"], {}, 512),  # 4 slots, split
    (["--ctx-per-slot", "4096", "-np", "2"], {}, 4096),
    (["-c", "8192", "-np", "2", "--kv-unified-per-slot", "1024"], {}, 1024),
    ([], {}, 0),  # lead chooses
])
def test_ctx_size_is_the_caches_total_split_among_the_slots(
        argv: list[str], env: dict[str, str], slot: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parse(*argv).slot_ctx == slot


def test_help_groups_the_flags_and_shows_llama_servers_names() -> None:
    text = build_parser(LeadSettings, "python -m lead", "").format_help()
    for section in ("model and devices:", "serving:", "speculation:", "backs:"):
        assert section in text
    for name in ("-c CTX_SIZE", "-ngl N_GPU_LAYERS", "-fa [FLASH_ATTN]", "-np PARALLEL",
                 "-t THREADS", "--alias ALIAS", "-to WRITE_TIMEOUT", "--no-webui"):
        assert name in text, name


def test_an_alias_names_the_model_in_replies_and_the_model_list() -> None:
    client = TestClient(create_app(make_settings(alias="my-model"), FakeModel()))
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["my-model"]
    assert client.post("/v1/chat/completions", json=chat_body()).json()["model"] == "my-model"


def test_no_webui_and_no_metrics_leave_those_paths_out() -> None:
    plain = TestClient(create_app(make_settings(), FakeModel()))
    assert plain.get("/").status_code == plain.get("/metrics").status_code == 200
    bare = TestClient(create_app(make_settings(webui=False, metrics=False), FakeModel()))
    assert bare.get("/").status_code == bare.get("/metrics").status_code == 404
    assert bare.post("/v1/chat/completions", json=chat_body()).status_code == 200


@pytest.mark.real
def test_a_service_units_llama_server_command_line_serves_as_python_m_lead() -> None:
    if not (cache_dir() / PRESETS["smollm2-135m"].filename).is_file():
        pytest.skip("SmolLM2 not installed: make models")
    port = free_port()
    lead = subprocess.Popen([sys.executable, "-m", "lead", *UNIT, "--port", str(port)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert lead.poll() is None, lead.communicate()[1][-2000:]
            try:
                return httpx.get(f"{url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, 300, "lead to serve")
        key = {"Authorization": "Bearer s3cret"}
        assert httpx.post(f"{url}/v1/chat/completions", json=chat_body()).status_code == 401
        r = httpx.post(f"{url}/v1/chat/completions", json=chat_body(max_tokens=4),
                       headers=key, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "my-model"
        # llama-server's own endpoints on the real tokenizer
        text = "def add(a, b):\n    return a + b"
        ids = httpx.post(f"{url}/tokenize", json={"content": text, "with_pieces": True},
                         headers=key).json()["tokens"]
        assert "".join(p["piece"] for p in ids) == text
        back = httpx.post(f"{url}/detokenize", json={"tokens": [p["id"] for p in ids]},
                          headers=key).json()
        assert back == {"content": text}
        props = httpx.get(f"{url}/props", headers=key).json()
        assert props["model_path"].endswith(".gguf") and props["total_slots"] == 2
        assert props["default_generation_settings"]["n_ctx"] == 1024  # -c 2048 over 2 slots
        assert httpx.get(f"{url}/models", headers=key).json()["data"][0]["id"] == "my-model"
        done = httpx.post(f"{url}/completion", headers=key, timeout=60, json={
            "prompt": "def add(a, b):", "n_predict": 8, "return_tokens": True}).json()
        assert done["stop"] is True and done["tokens_predicted"] == len(done["tokens"]) > 0
        assert done["content"] and done["timings"]["predicted_n"] == done["tokens_predicted"]
    finally:
        lead.terminate()
        lead.wait(30)


H100 = [("CUDA0", 1, "NVIDIA H100"), ("CPU", 0, "Intel Xeon")]


@pytest.mark.parametrize(("devices", "more", "one_cpu"), [
    ([("CPU", 0, "AMD EPYC")], [], False),  # nothing to offload to: every core
    (H100, [], True),
    (H100, ["-dev", "none"], False),  # told to offload nothing: every core
    ([("CPU", 0, "AMD EPYC")], ["--rpc", "127.0.0.1:50052"], True),  # to the RPC server
])
def test_ngl_all_leaves_cpus_to_backs_only_where_a_device_takes_the_layers(
        monkeypatch: pytest.MonkeyPatch, devices: list, more: list[str],
        one_cpu: bool) -> None:
    from lead.server.app import lead_placement
    from shared.llama import ggml

    monkeypatch.setattr(ggml, "devices", lambda: devices)
    placement = lead_placement(parse("-ngl", "all", *more))
    assert (placement.threads == 1 and placement.cpus is not None) is one_cpu, placement


def test_temp_and_seed_are_what_a_request_that_gives_none_gets() -> None:
    def text(c: TestClient, **body: object) -> str:
        reply = c.post("/v1/chat/completions", json=chat_body(max_tokens=24, **body)).json()
        return reply["choices"][0]["message"]["content"]

    sampled = TestClient(create_app(make_settings(temp=1.5, seed=42), FakeModel()))
    assert text(sampled) == text(sampled) == text(sampled, temperature=1.5, seed=42)
    assert text(sampled) != text(sampled, temperature=0)  # --temp applied, not greedy
    greedy = TestClient(create_app(make_settings(), FakeModel()))
    assert text(greedy) == text(greedy, temperature=0) == text(sampled, temperature=0)
    assert parse("--temp", "0.8", "--seed", "-1").seed is None

"""llama-server's RoPE/YaRN, offload, repack, tensor-check and --fit flags under its names,
each meaning what it means there: parsed, refused in one line, and built into llama.cpp's
context and model parameters as llama.cpp reads them (unit); then a real lead that loads
SmolLM2 with some of them, llama.cpp saying it took them, and serves (real)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import llama_cpp
import pytest

from lead.server import app as lead_app
from lead.server.settings import LeadSettings
from shared.cli import build_parser, parse_settings
from shared.llama import model as llm_model
from shared.llama.load import ContextShape, RopeScaling, Tuning, context_params, model_params
from tests.leadproc import smollm2_lead


def parse(*argv: str) -> LeadSettings:
    return parse_settings(LeadSettings, "python -m lead", "", list(argv))


def shape(**more: Any) -> ContextShape:
    return ContextShape(n_ctx=256, n_seq=1, n_batch=64, threads=1, flash_attn=False, **more)


def test_rope_and_yarn_flags_as_llama_server_spells_them() -> None:
    s = parse("--rope-scaling", "yarn", "--rope-freq-base", "500000", "--rope-freq-scale",
              "0.25", "--yarn-orig-ctx", "4096", "--yarn-ext-factor", "0.5",
              "--yarn-attn-factor", "1.5", "--yarn-beta-slow", "2", "--yarn-beta-fast", "16")
    assert s.rope() == {"scaling": "yarn", "freq_base": 500000.0, "freq_scale": 0.25,
                        "yarn_orig_ctx": 4096, "yarn_ext_factor": 0.5,
                        "yarn_attn_factor": 1.5, "yarn_beta_slow": 2.0, "yarn_beta_fast": 16.0}
    assert parse("--rope-scale", "4").rope()["freq_scale"] == 0.25  # as arg.cpp: 1/N
    assert set(parse().rope().values()) == {None}  # nothing given: the model's own


def test_offload_repack_and_check_switches_short_and_long() -> None:
    assert parse().switches() == {"kv_offload": True, "op_offload": True, "repack": True,
                                  "check_tensors": False}  # llama-server's defaults
    for off in (["-nkvo"], ["--no-kv-offload"], ["-kvo", "-nkvo"]):
        assert parse(*off).kv_offload is False, off
    assert parse("-nkvo", "-kvo").kv_offload and parse("--kv-offload").kv_offload  # last wins
    assert parse("-nr").repack is False and parse("--no-repack").repack is False
    assert parse("-nr", "--repack").repack
    s = parse("--no-op-offload", "--check-tensors")
    assert (s.op_offload, s.check_tensors) == (False, True)


def test_negative_names_set_the_field_from_the_environment_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_KV_OFFLOAD", "false")
    assert parse().kv_offload is False and parse("-kvo").kv_offload  # a flag over the env


@pytest.mark.parametrize("off", ["off", "disabled", "false", "0"])  # arg.cpp's is_falsey
def test_fit_off_is_accepted_in_each_of_llama_cpps_spellings(off: str) -> None:
    assert parse("-fit", off).fit == parse("--fit", off).fit == "off"
    assert parse().fit is None


@pytest.mark.parametrize(("argv", "said"), [
    (["-fit", "on"], "fit: lead does not shrink parameters to fit device memory: it sizes its "
     "context from memory itself (-c 0)"),
    (["--fit", "true"], "give --fit off (or leave it out), with -c and -ngl as wanted"),
    (["--fit", "maybe"], "fit: unknown value 'maybe' (on or off)"),
    (["--rope-scaling", "ntk"], "rope-scaling: Input should be 'none', 'linear' or 'yarn'"),
    (["--rope-scale", "0"], "rope-scale: Input should be greater than 0"),
    (["--rope-scale", "inf"], "rope-scale: Input should be a finite number"),
    (["--rope-freq-base", "-1"], "rope-freq-base: Input should be greater than or equal to 0"),
    (["--rope-freq-scale", "half"], "argument --rope-freq-scale: invalid float value: 'half'"),
    (["--rope-scale", "2", "--rope-freq-scale", "0.5"],
     "--rope-scale N is --rope-freq-scale 1/N: give one"),
    (["--yarn-orig-ctx", "-8"], "yarn-orig-ctx: Input should be greater than or equal to 0"),
    (["--yarn-ext-factor", "nan"], "yarn-ext-factor: Input should be a finite number"),
    (["--yarn-beta-fast", "x"], "argument --yarn-beta-fast: invalid float value: 'x'"),
    (["-nkvo", "1"], "unrecognized arguments: 1"),  # a switch takes no value
])
def test_a_bad_value_is_a_one_line_error(argv: list[str], said: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and said in err[-1], err


def test_help_shows_them_among_the_model_and_device_flags() -> None:
    text = build_parser(LeadSettings, "python -m lead", "").format_help()
    section = text.split("model and devices:")[1].split("\n\n")[0]
    for name in ("--rope-scaling ROPE_SCALING", "--rope-scale ROPE_SCALE", "--rope-freq-base",
                 "--rope-freq-scale", "--yarn-orig-ctx", "--yarn-ext-factor",
                 "--yarn-attn-factor", "--yarn-beta-slow", "--yarn-beta-fast",
                 "--kv-offload, --no-kv-offload, -kvo, -nkvo", "--op-offload, --no-op-offload",
                 "--repack, --no-repack, -nr", "--check-tensors", "--fit FIT, -fit FIT"):
        assert name in section, name


def test_rope_and_yarn_reach_the_context_params_as_llama_cpp_reads_them() -> None:
    rope = RopeScaling("yarn", 500000.0, 0.25, 4096, 0.5, 1.5, 2.0, 16.0)
    params = context_params(shape(rope=rope))
    assert params.rope_scaling_type == llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN
    assert (params.rope_freq_base, params.rope_freq_scale, params.yarn_orig_ctx) == (
        500000.0, 0.25, 4096)
    assert (params.yarn_ext_factor, params.yarn_attn_factor, params.yarn_beta_slow,
            params.yarn_beta_fast) == (0.5, 1.5, 2.0, 16.0)
    for name, type_ in (("none", llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE),
                        ("linear", llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR)):
        assert context_params(shape(rope=RopeScaling(name))).rope_scaling_type == type_


def test_rope_not_given_keeps_llama_cpps_from_the_model_defaults() -> None:
    default, params = llama_cpp.llama_context_default_params(), context_params(shape())
    fields = ("rope_scaling_type", "rope_freq_base", "rope_freq_scale", "yarn_orig_ctx",
              "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow", "yarn_beta_fast")
    assert [getattr(params, f) for f in fields] == [getattr(default, f) for f in fields]
    assert params.rope_scaling_type == llama_cpp.LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED
    assert (params.rope_freq_base, params.yarn_orig_ctx, params.yarn_ext_factor) == (0, 0, -1)
    assert (params.offload_kqv, params.op_offload) == (True, True)


def test_kv_and_op_offload_reach_the_context_params() -> None:
    params = context_params(shape(kv_offload=False, op_offload=False))
    assert (params.offload_kqv, params.op_offload) == (False, False)


def test_repack_and_check_tensors_reach_the_model_params() -> None:
    params, _ = model_params(0, None)
    assert (params.use_extra_bufts, params.check_tensors) == (True, False)  # llama.cpp's
    params, _ = model_params(0, None, Tuning(repack=False, check_tensors=True))
    assert (params.use_extra_bufts, params.check_tensors) == (False, True)


def test_lead_hands_the_flags_to_the_model_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    told: dict[str, Any] = {}

    class Loaded:
        def use_chat_template(self, *_: Any) -> None:
            pass

    def load_model(spec: str, **kwargs: Any) -> Loaded:
        told.update(kwargs)
        return Loaded()

    monkeypatch.setattr(llm_model, "load_model", load_model)
    settings = parse("-m", "x.gguf", "--rope-scaling", "linear", "--rope-scale", "2",
                     "--yarn-beta-fast", "8", "-nkvo", "--no-op-offload", "-nr",
                     "--check-tensors", "-fit", "off")
    lead_app._load_target(settings, 1)
    more = told["more"]
    assert more.rope == RopeScaling("linear", freq_scale=0.5, yarn_beta_fast=8.0)
    assert (more.kv_offload, more.op_offload, more.repack, more.check_tensors) == (
        False, False, False, True)


@pytest.mark.real
def test_lead_loads_and_serves_with_llama_servers_context_flags(tmp_path: Path) -> None:
    log = tmp_path / "lead.err"
    argv = ["-c", "512", "-np", "1", "-t", "1", "--rope-scaling",
            "linear", "--rope-freq-base", "20000", "--rope-scale", "2", "-nkvo",
            "--no-op-offload", "--check-tensors", "-nr", "-fit", "off", "--no-calibrate"]
    with smollm2_lead(argv, log) as url:
        done = httpx.post(f"{url}/completion", timeout=60,
                          json={"prompt": "def add(a, b):", "n_predict": 8}).json()
        assert done["content"] and done["tokens_predicted"] > 0
        # llama.cpp's own word for the context it made: the base and scale given
        text = log.read_text()
        assert "freq_base             = 20000.0" in text
        assert "freq_scale            = 0.5\n" in text

"""llama-server's device and offload flags (-dev, --list-devices, -ot, -cmoe, -ncmoe, -sm,
-mg, --numa) under its names, each meaning what it means there: parsed, refused in one
line, and built into llama.cpp's model parameters as llama.cpp reads them (unit); then a
real lead that loads SmolLM2 with them and serves (real)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import httpx
import llama_cpp
import pytest

from lead.__main__ import main
from lead.server.settings import LeadSettings
from shared.cli import build_parser, parse_settings
from shared.llama import ggml
from shared.llama.load import BuftOverride, Tuning, init_numa, model_params
from shared.offload import FFN_DENSE, FFN_EXPS
from shared.presets import ModelError
from tests.leadproc import smollm2_lead

EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # llama.cpp's common.h, as written there


def parse(*argv: str) -> LeadSettings:
    return parse_settings(LeadSettings, "python -m lead", "", list(argv))


def test_device_flags_under_llama_servers_short_and_long_names() -> None:
    short = parse("-dev", "CUDA0,RPC0", "-sm", "row", "-mg", "1", "--numa", "isolate")
    long = parse("--device", "CUDA0,RPC0", "--split-mode", "row", "--main-gpu", "1")
    for s in (short, long):
        assert s.offload()["devices"] == ("CUDA0", "RPC0")
        assert (s.offload()["split_mode"], s.offload()["main_gpu"]) == ("row", 1)
    assert short.numa == "isolate" and long.numa is None
    assert parse("-dev", "none").offload()["devices"] == ()  # none: no device
    assert parse().offload() == {"devices": None, "split_mode": None, "main_gpu": None,
                                   "overrides": ()}  # llama.cpp's own choice
    assert parse("--numa", "").numa == "distribute"  # as llama-server reads it empty


def test_overrides_in_order_with_moe_patterns_as_llama_cpp_writes_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert FFN_EXPS == EXPS and FFN_DENSE == r"\.ffn_(up|down|gate)\."
    s = parse("-ot", r"blk\.0\.=CPU,exps=CUDA0", "--override-tensor", "token_embd=CPU",
              "-ncmoe", "2", "-ncffn", "1", "-cmoe")
    assert s.offload()["overrides"] == (
        (r"blk\.0\.", "CPU"), ("exps", "CUDA0"), ("token_embd", "CPU"),  # -ot given twice
        (rf"blk\.0{EXPS}", "CPU"), (rf"blk\.1{EXPS}", "CPU"), (rf"blk\.0{FFN_DENSE}", "CPU"),
        (EXPS, "CPU"))
    assert parse("--cpu-moe").offload()["overrides"] == ((EXPS, "CPU"),)
    assert parse("--n-cpu-moe", "0").offload()["overrides"] == ()
    monkeypatch.setenv("LEAD_OVERRIDE_TENSOR", "a=CPU")
    assert parse().offload()["overrides"] == (("a", "CPU"),)


@pytest.mark.parametrize(("argv", "said"), [
    (["-dev", "none,CUDA0"], "'none' alone"),
    (["-dev", "CUDA0,,CUDA1"], "device names, comma-separated"),
    (["-dev", ""], "device names"),
    (["-ot", "exps"], "'exps' is not PATTERN=BUFFER_TYPE"),
    (["-ot", "a=CPU,"], "'' is not PATTERN=BUFFER_TYPE"),
    (["-ot", "(=CPU"], "'(' is not a regular expression"),
    (["-ncmoe", "-1"], "n-cpu-moe"),
    (["-sm", "rows"], "split-mode"),
    (["-mg", "first"], "main-gpu"),
    (["--numa", "mirror"], "numa"),
])
def test_a_bad_device_flag_is_a_one_line_error(
        argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(*argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and err.strip().splitlines()[-1].count(said)


def test_help_shows_them_among_the_model_and_device_flags() -> None:
    text = build_parser(LeadSettings, "python -m lead", "").format_help()
    section = text.split("model and devices:")[1].split("\n\n")[0]
    for name in ("-dev DEVICE", "--list-devices", "-ot OVERRIDE_TENSOR", "-cmoe",
                 "-ncmoe N_CPU_MOE", "-sm SPLIT_MODE", "-mg MAIN_GPU", "--numa NUMA"):
        assert name in section, name


def test_devices_are_a_null_terminated_array_of_ggml_devices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    handles = {"CUDA0": 0x1000, "RPC0": 0x2000}
    monkeypatch.setattr(ggml, "device_handles", lambda names: [handles[n] for n in names])
    params, kept = model_params(0, None, Tuning(devices=("RPC0", "CUDA0")))
    array = (ctypes.c_void_p * 3).from_address(params.devices)
    assert list(array) == [0x2000, 0x1000, None] and kept[1] is not None
    # chosen devices with no layers offloaded: llama.cpp's defaults, not lead's no-device
    default = llama_cpp.llama_model_default_params()
    assert (params.split_mode, params.main_gpu) == (default.split_mode, default.main_gpu)
    none, _ = model_params(99, None, Tuning(devices=()))
    assert ctypes.c_void_p.from_address(none.devices).value is None  # -dev none: just NULL
    assert model_params(99, None)[0].devices is None  # not given: llama.cpp chooses


def test_overrides_are_pattern_and_buffer_type_pairs_ended_by_nulls() -> None:
    params, kept = model_params(0, None, Tuning(overrides=((r"blk\.0\.", "CPU"),
                                                           (EXPS, "CPU"))))
    array = (BuftOverride * 3).from_address(params.tensor_buft_overrides)
    cpu = ggml.buffer_types()["CPU"]
    assert [(e.pattern, e.buft) for e in array] == [
        (rb"blk\.0\.", cpu), (EXPS.encode(), cpu), (None, None)]
    assert kept[2] is not None and model_params(0, None)[0].tensor_buft_overrides is None


def test_split_mode_and_main_gpu_reach_the_params() -> None:
    params, _ = model_params(99, None, Tuning(split_mode="row", main_gpu=1))
    assert (params.split_mode, params.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_ROW, 1)
    params, _ = model_params(0, None, Tuning(split_mode="none"))  # chosen: main GPU 0
    assert (params.split_mode, params.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_NONE, 0)


def test_an_unknown_device_or_buffer_type_names_those_there_are() -> None:
    cpu_only = ggml.offload_devices() == []
    with pytest.raises(ModelError, match=r"--device: no device 'CPU' to offload to \(devices: "
                       + ("none here" if cpu_only else "")):  # the CPU is none, as there
        model_params(99, None, Tuning(devices=("CPU",)))
    with pytest.raises(ModelError, match=r"--device: no device 'NPU9'"):
        model_params(99, None, Tuning(devices=("NPU9",)))
    with pytest.raises(ModelError, match=r"no buffer type 'GPU' \(buffer types: .*CPU"):
        model_params(99, None, Tuning(overrides=(("exps", "GPU"),)))


def test_numa_is_set_through_llama_cpp_before_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[int] = []
    monkeypatch.setattr(llama_cpp, "llama_numa_init", told.append)
    for name in ("distribute", "isolate", "numactl"):
        init_numa(name)
    assert told == [llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE,
                    llama_cpp.GGML_NUMA_STRATEGY_ISOLATE, llama_cpp.GGML_NUMA_STRATEGY_NUMACTL]


def test_list_devices_prints_those_device_may_name_and_exits(
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["--list-devices"])  # returns: no model loaded, no port taken
    lines = capsys.readouterr().out.splitlines()
    names = ggml.offload_devices()
    assert lines[0] == "Available devices:"
    assert [line.split(":")[0].strip() for line in lines[1:]] == (names or ["(none)"])


@pytest.mark.real
def test_lead_loads_and_serves_with_llama_servers_device_flags(tmp_path: Path) -> None:
    log = tmp_path / "lead.err"
    argv = ["-c", "512", "-np", "1", "-t", "1", "-ngl", "99",
            "-dev", "none", "-ot", r"blk\.0\.=CPU", "-ot", "output_norm=CPU", "-ncmoe", "1",
            "-sm", "none", "-mg", "0", "--numa", "distribute", "--no-calibrate"]
    with smollm2_lead(argv, log) as url:
        done = httpx.post(f"{url}/completion", timeout=60,
                          json={"prompt": "def add(a, b):", "n_predict": 8}).json()
        assert done["content"] and done["tokens_predicted"] > 0
        # llama.cpp's own word that it read the overrides: "tensor NAME (...) buffer type
        # overridden to CPU", for those tensors and no others
        moved = {line.split()[1] for line in log.read_text().splitlines()
                 if line.startswith("tensor ") and line.endswith("overridden to CPU")}
        assert {"blk.0.attn_q.weight", "blk.0.ffn_up.weight", "output_norm.weight"} <= moved
        assert all(name.startswith("blk.0.") or name == "output_norm.weight" for name in moved)

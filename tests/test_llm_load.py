"""shared/llama/load.py: one context made once with its final parameters, no GPU device for a
model with no layers offloaded, llama.cpp's log routed (unit); then a real load (SmolLM2)
with slots and branches that makes exactly one context."""

from __future__ import annotations

import os

import llama_cpp
import numpy as np
import pytest

from shared.llama import load as llm_load
from shared.llama.load import ALL_LAYERS, ContextShape, LogRoute, context_params, model_params


def test_a_model_with_no_layers_offloaded_gets_no_gpu_device() -> None:
    params, _ = model_params(0, None)
    # llama.cpp clears the device list for split mode none with no main GPU
    assert (params.split_mode, params.main_gpu) == (llama_cpp.LLAMA_SPLIT_MODE_NONE, -1)
    assert params.n_gpu_layers == 0


def test_offloaded_layers_keep_llama_cpps_device_choice() -> None:
    default = llama_cpp.llama_model_default_params()
    for layers, wanted in ((-1, ALL_LAYERS), (12, 12)):
        params, _ = model_params(layers, None)
        assert params.n_gpu_layers == wanted
        assert (params.split_mode, params.main_gpu) == (default.split_mode, default.main_gpu)


def test_a_tensor_split_is_kept_where_the_params_point() -> None:
    params, kept = model_params(-1, [1.0, 3.0])
    assert kept is not None and [params.tensor_split[i] for i in range(3)] == [1.0, 3.0, 0.0]


def test_the_context_holds_every_sequence_unified_and_a_batch_it_can_take() -> None:
    params = context_params(ContextShape(n_ctx=336, n_seq=6, n_batch=512, threads=3,
                                         flash_attn=True))
    assert (params.n_ctx, params.n_seq_max, params.kv_unified) == (336, 6, True)
    assert params.n_batch == params.n_ubatch == 336  # never more than the context
    assert (params.n_threads, params.n_threads_batch) == (3, 3)
    assert params.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED


def test_llama_cpps_errors_print_and_the_rest_only_when_asked(
        capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LogRoute, "hook", None)
    monkeypatch.delenv(llm_load.LOG_ENV, raising=False)
    LogRoute.write(llm_load.GGML_LOG_INFO, "an info line\n")
    LogRoute.write(llm_load.GGML_LOG_CONT, " continued\n")  # a continuation: its line's level
    LogRoute.write(llm_load.GGML_LOG_WARN, "a warning\n")
    LogRoute.write(llm_load.GGML_LOG_ERROR, "an error line\n")
    LogRoute.write(llm_load.GGML_LOG_CONT, " continued\n")
    assert capfd.readouterr().err == "a warning\nan error line\n continued\n"
    monkeypatch.setenv(llm_load.LOG_ENV, "1")
    LogRoute.write(llm_load.GGML_LOG_INFO, "an info line\n")
    assert capfd.readouterr().err == "an info line\n"


def test_a_line_the_hook_takes_is_not_printed(capfd: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[str] = []
    monkeypatch.setattr(LogRoute, "hook", lambda level, text: taken.append(text) or True)
    LogRoute.write(llm_load.GGML_LOG_ERROR, "a grammar's parse error\n")
    assert taken == ["a grammar's parse error\n"] and capfd.readouterr().err == ""


@pytest.mark.real
def test_slots_and_branches_are_one_context_made_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.llama.model import load_model

    made: list[object] = []
    real = llama_cpp.llama_init_from_model

    def counted(model: object, params: llama_cpp.llama_context_params) -> object:
        made.append((params.n_ctx, params.n_seq_max, params.n_batch))
        return real(model, params)

    monkeypatch.setattr(llama_cpp, "llama_init_from_model", counted)
    model = load_model("smollm2-135m", threads=1, n_ctx=336, branches=2, slots=2)
    try:
        assert made == [(672, 6, 512)]  # 2 slots x 336 cells; 2 x (1 + 2) sequences
        assert llama_cpp.llama_n_seq_max(model._ctx) == 6
        assert model.n_batch == llama_cpp.llama_n_batch(model._ctx) <= 512
        assert model.n_ctx >= 336 and model.n_slots == 2
        # the batch the model says it takes is one llama.cpp takes (no GGML_ASSERT)
        tokens = [model.tokenize("x")[-1]] * min(model.n_batch, model.n_ctx)
        assert model.evaluate(tokens, 1).shape == (1, model.n_vocab)
        assert np.isfinite(model.slot(1).evaluate(tokens[:8], 8)).all()
    finally:
        model.close()


@pytest.mark.real
def test_a_small_context_reads_its_batch_back() -> None:
    from shared.llama.model import load_model

    model = load_model("smollm2-135m", threads=1, n_ctx=128)
    try:
        assert model.n_batch == llama_cpp.llama_n_batch(model._ctx) <= model.n_ctx
        tokens = [model.tokenize("x")[-1]] * model.n_ctx
        assert model.evaluate(tokens, 1).shape == (1, model.n_vocab)  # in n_batch chunks
    finally:
        model.close()


@pytest.mark.parametrize(("found", "spared"), [
    ([("Vulkan0", 1, "llvmpipe (LLVM 15.0.6, 256 bits)"), ("CPU", 0, "AMD EPYC")], True),
    ([("Vulkan0", 1, "NVIDIA GeForce RTX 4090"), ("CPU", 0, "AMD EPYC")], False),
    ([("CUDA0", 1, "NVIDIA H100 80GB HBM3"), ("CPU", 0, "Intel Xeon")], False),
    ([("CPU", 0, "AMD EPYC")], False),
])
def test_ggmls_fused_kernels_are_off_on_lavapipe_alone(
        monkeypatch: pytest.MonkeyPatch, found: list[tuple[str, int, str]],
        spared: bool) -> None:
    from shared.llama import ggml

    monkeypatch.setattr(ggml, "devices", lambda: found)
    monkeypatch.delenv(llm_load.NO_FUSION, raising=False)
    assert llm_load.spare_lavapipe() is spared
    assert (os.environ.get(llm_load.NO_FUSION) == "1") is spared


def test_a_users_own_fusion_choice_is_kept_on_lavapipe(monkeypatch: pytest.MonkeyPatch) -> None:
    from shared.llama import ggml

    monkeypatch.setattr(ggml, "devices", lambda: [("Vulkan0", 1, "llvmpipe (LLVM 15)")])
    monkeypatch.setenv(llm_load.NO_FUSION, "0")
    assert llm_load.spare_lavapipe() is False and os.environ[llm_load.NO_FUSION] == "0"

"""llama-server's flags that have no lead name of their own, under llama-server's names.

Each means what it means there, or is refused naming why: a script written for
`llama-server` starts `python -m lead` unchanged, or fails at once, never silently.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator
from pydantic_settings import BaseSettings

from shared.cli import cli, readable_file
from shared.offload import all_overrides, device_names, tensor_overrides

MODEL, SERVING = "model and devices", "serving"
# -ctk/-ctv: the KV cache types llama-server takes, as ggml's type numbers (ggml.h)
CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8,
               "iq4_nl": 20, "bf16": 30}
CacheType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"]
# arg.cpp's is_truthy and is_falsey: the spellings of on and off
TRUTHY, FALSEY = ("on", "enabled", "true", "1"), ("off", "disabled", "false", "0")


def fit_off(value: Any) -> Any:
    """--fit: off as arg.cpp spells it; on refused (lead does not fit), else unknown."""
    if value is None or value in FALSEY:
        return None if value is None else "off"
    if value in TRUTHY:
        raise ValueError("lead does not shrink parameters to fit device memory: it sizes "
                         "its context from memory itself (-c 0) and offloads the layers -ngl "
                         "names; give --fit off (or leave it out), with -c and -ngl as wanted")
    raise ValueError(f"unknown value {value!r} (on or off)")


Fit = Annotated[Literal["off"] | None, BeforeValidator(fit_off)]
# --numa given empty: distribute, as llama-server reads it
Numa = Annotated[Literal["distribute", "isolate", "numactl"] | None,
                 BeforeValidator(lambda v: "distribute" if v == "" else v)]


class LlamaServerFlags(BaseSettings):
    """The flags a llama-server command line carries that lead takes as they are."""

    chat_template: str | None = Field(None, description="the chat template instead of the "
                                      "GGUF's: Jinja source (with --jinja), or a name llama.cpp "
                                      "knows (chatml, llama3, command-r, ...) with --no-jinja",
                                      json_schema_extra=cli(MODEL))
    chat_template_file: str | None = Field(None, description="a file holding the chat "
                                           "template (as --chat-template)",
                                           json_schema_extra=cli(MODEL))
    cache_type_k: CacheType = Field("f16", description="the KV cache's type for keys",
                                    json_schema_extra=cli(MODEL, "-ctk"))
    cache_type_v: CacheType = Field("f16", description="the KV cache's type for values",
                                    json_schema_extra=cli(MODEL, "-ctv"))
    swa_full: bool = Field(False, description="a full-size cache for sliding-window "
                           "attention layers", json_schema_extra=cli(MODEL))
    kv_unified: bool = Field(False, description="a slot may hold all of --ctx-size, as "
                             "llama-server's -kvu; lead keeps that room for every slot, so its "
                             "cache holds --parallel times --ctx-size where llama-server's "
                             "slots share one (default: on where --parallel is not given, as "
                             "llama-server's -np auto; off where it is: each slot its share)",
                             json_schema_extra=cli(MODEL, "-kvu"))
    device: str | None = Field(None, description="devices to offload to, comma-separated, "
                               "as --list-devices names them (none: offload nothing; default: "
                               "every GPU and --rpc server)", json_schema_extra=cli(MODEL, "-dev"))
    list_devices: bool = Field(False, description="print the devices --device may name, "
                               "and exit", json_schema_extra=cli(MODEL))
    override_tensor: str | None = Field(None, description="PATTERN=BUFFER_TYPE,...: the "
                                        "tensors whose names match the regular expression "
                                        "go to that buffer type (CPU, CUDA0, ...); given "
                                        "again, added to", json_schema_extra=cli(
                                            MODEL, "-ot", repeat=True))
    cpu_moe: bool = Field(False, description="keep every Mixture of Experts layer's expert "
                          "weights on the CPU", json_schema_extra=cli(MODEL, "-cmoe"))
    n_cpu_moe: int = Field(0, ge=0, description="keep the expert weights of the first N "
                           "layers on the CPU", json_schema_extra=cli(MODEL, "-ncmoe"))
    n_cpu_ffn: int = Field(0, ge=0, description="keep the dense feed-forward weights of the "
                           "first N layers on the CPU", json_schema_extra=cli(MODEL, "-ncffn"))
    split_mode: Literal["none", "layer", "row", "tensor"] | None = Field(
        None, description="how the model is split across GPUs: none (--main-gpu only), layer, "
        "row, tensor (default: layer; none where no layer is offloaded and no device is "
        "chosen)", json_schema_extra=cli(MODEL, "-sm"))
    main_gpu: int | None = Field(None, description="the GPU for the whole model with "
                                 "--split-mode none, for intermediate results and the KV "
                                 "cache with row (default: 0)",
                                 json_schema_extra=cli(MODEL, "-mg"))
    numa: Numa = Field(None, description="ggml's NUMA strategy: distribute (threads over "
                       "every node), isolate (the starting node's CPUs), numactl (numactl's "
                       "CPU map)", json_schema_extra=cli(MODEL))
    rope_scaling: Literal["none", "linear", "yarn"] | None = Field(
        None, description="RoPE frequency scaling: none, linear, yarn (default: the model's, "
        "else linear)", json_schema_extra=cli(MODEL))
    rope_scale: float | None = Field(None, gt=0, allow_inf_nan=False, description="RoPE "
                                     "context scaling factor: expands the context N times "
                                     "(--rope-freq-scale 1/N)", json_schema_extra=cli(MODEL))
    rope_freq_base: float | None = Field(None, ge=0, allow_inf_nan=False, description="RoPE "
                                         "base frequency, for NTK-aware scaling (default: the "
                                         "model's)", json_schema_extra=cli(MODEL))
    rope_freq_scale: float | None = Field(None, ge=0, allow_inf_nan=False, description="RoPE "
                                          "frequency scaling factor: expands the context 1/N "
                                          "times (default: the model's)",
                                          json_schema_extra=cli(MODEL))
    yarn_orig_ctx: int | None = Field(None, ge=0, description="YaRN: the model's original "
                                      "context size (default: its training context)",
                                      json_schema_extra=cli(MODEL))
    yarn_ext_factor: float | None = Field(None, allow_inf_nan=False, description="YaRN: "
                                          "extrapolation mix factor, 0.0 full interpolation "
                                          "(default: the model's, else 1.0 with YaRN "
                                          "scaling, 0.0 without)", json_schema_extra=cli(MODEL))
    yarn_attn_factor: float | None = Field(None, allow_inf_nan=False, description="YaRN: "
                                           "scale sqrt(t) or attention magnitude (default: "
                                           "the model's)", json_schema_extra=cli(MODEL))
    yarn_beta_slow: float | None = Field(None, allow_inf_nan=False, description="YaRN: high "
                                         "correction dim or alpha (default: the model's)",
                                         json_schema_extra=cli(MODEL))
    yarn_beta_fast: float | None = Field(None, allow_inf_nan=False, description="YaRN: low "
                                         "correction dim or beta (default: the model's)",
                                         json_schema_extra=cli(MODEL))
    kv_offload: bool = Field(True, description="keep the KV cache on the devices its layers "
                             "are offloaded to (-nkvo: in host memory)",
                             json_schema_extra=cli(MODEL, "-kvo", negative="-nkvo"))
    op_offload: bool = Field(True, description="offload host tensors' operations to the "
                             "device", json_schema_extra=cli(MODEL))
    repack: bool = Field(True, description="repack weights for the CPU's faster kernels "
                         "(llama.cpp's extra buffer types)",
                         json_schema_extra=cli(MODEL, negative="-nr"))
    check_tensors: bool = Field(False, description="check the model's tensor data for "
                                "invalid values as it loads", json_schema_extra=cli(MODEL))
    fit: Fit = Field(None, description="llama-server's fitting of unset parameters to "
                     "device memory: lead sizes its context itself (-c 0), so only off is "
                     "accepted (default: off)", json_schema_extra=cli(MODEL, "-fit"))
    offline: bool = Field(False, description="download nothing: a preset not yet in the "
                          "cache is an error (lead never reaches a model hub)",
                          json_schema_extra=cli(MODEL))
    cont_batching: bool = Field(True, description="decode the slots' generations in one "
                                "batch a step (lead always does: -cb is accepted, "
                                "--no-cont-batching refused)",
                                json_schema_extra=cli(SERVING, "-cb"))
    slots: bool = Field(True, description="serve GET /slots, each slot's state "
                        "(--no-slots: not)", json_schema_extra=cli(SERVING))
    slot_save_path: str | None = Field(None, description="a folder where POST "
                                       "/slots/ID?action=save writes a slot's cache and "
                                       "action=restore reads it back (unset: those refused)",
                                       json_schema_extra=cli(SERVING))
    embeddings: bool = Field(False, description="serve embeddings (/v1/embeddings, "
                             "/embedding) of the model's hidden states",
                             json_schema_extra=cli(SERVING, "--embedding"))
    pooling: Literal["none", "mean", "cls", "last"] | None = Field(
        None, description="how --embeddings pools a text's token vectors (default: the "
        "GGUF's, else mean)", json_schema_extra=cli(SERVING))
    reasoning: Literal["on", "off", "auto"] = Field(
        "auto", description="a thinking model's reasoning where a request does not set it "
        "(chat_template_kwargs.enable_thinking): on (auto: the same), off (the template's "
        "switch off, or the reasoning it opens closed at once)",
        json_schema_extra=cli(MODEL, "-rea"))
    reasoning_format: Literal["none", "deepseek", "deepseek-legacy", "auto"] = Field(
        "auto", description="where a reply's reasoning goes: auto/deepseek: "
        "reasoning_content (OpenAI), thinking blocks (Anthropic); none: left in the content",
        json_schema_extra=cli(MODEL))
    backend_sampling: bool = Field(False, description="llama-server's sampling on the "
                                   "GPU: lead samples where it verifies drafts, exactly, so "
                                   "this is accepted and changes nothing",
                                   json_schema_extra=cli(SERVING, "--backend_sampling"))
    verbose: bool = Field(False, description="log everything (--log-level debug)",
                          json_schema_extra=cli(SERVING, "-v"))
    tags: str | None = Field(None, description="the model's tags, comma-separated, shown in "
                             "/v1/models", json_schema_extra=cli(SERVING))
    context_shift: bool = Field(False, description="llama-server's context shift (dropping "
                                "the oldest tokens to go on past the context's end): lead ends "
                                "a reply there (finish_reason length), so only --no-context-"
                                "shift is accepted", json_schema_extra=cli(SERVING))

    @field_validator("device")
    @classmethod
    def _devices(cls, value: str | None) -> str | None:
        device_names(value)
        return value

    @field_validator("override_tensor")
    @classmethod
    def _overrides(cls, value: str | None) -> str | None:
        tensor_overrides(value)
        return value

    def offload(self) -> dict[str, Any]:
        """Where the weights go, as shared.llama.load.Tuning takes it."""
        return {"devices": device_names(self.device), "split_mode": self.split_mode,
                "main_gpu": self.main_gpu,
                "overrides": all_overrides(self.override_tensor, self.n_cpu_moe,
                                           self.n_cpu_ffn, self.cpu_moe)}

    @model_validator(mode="after")
    def _one_rope_scale(self) -> LlamaServerFlags:
        if self.rope_scale is not None and self.rope_freq_scale is not None:
            raise ValueError("--rope-scale N is --rope-freq-scale 1/N: give one")
        return self

    def rope(self) -> dict[str, Any]:
        """--rope-* and --yarn-*, as shared.llama.load.RopeScaling takes them (None: the
        model's own)."""
        scale = 1 / self.rope_scale if self.rope_scale else self.rope_freq_scale
        return {"scaling": self.rope_scaling, "freq_base": self.rope_freq_base,
                "freq_scale": scale, "yarn_orig_ctx": self.yarn_orig_ctx,
                "yarn_ext_factor": self.yarn_ext_factor, "yarn_attn_factor": self.yarn_attn_factor,
                "yarn_beta_slow": self.yarn_beta_slow, "yarn_beta_fast": self.yarn_beta_fast}

    def switches(self) -> dict[str, bool]:
        """llama.cpp's on/off knobs, as shared.llama.load.Tuning takes them."""
        return {"kv_offload": self.kv_offload, "op_offload": self.op_offload,
                "repack": self.repack, "check_tensors": self.check_tensors}

    @field_validator("cont_batching")
    @classmethod
    def _always(cls, value: bool) -> bool:
        if not value:
            raise ValueError("lead always decodes its slots' generations in one batch a step")
        return value

    @field_validator("context_shift")
    @classmethod
    def _shift(cls, value: bool) -> bool:
        if value:
            raise ValueError("lead does not shift the context: a reply ends at the "
                             "context's end (finish_reason length); give a larger --ctx-size")
        return value

    @field_validator("chat_template_file")
    @classmethod
    def _template_file(cls, value: str | None) -> str | None:
        return readable_file(value)

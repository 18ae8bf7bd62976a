"""A model and its one context, made through llama.cpp's C API with their final parameters
(shared/llama/model.py builds on them; nothing else here touches llama.cpp's loading).

One context, made once: slots x (1 + branches) sequences in one unified KV cache of the
chosen size, its batch read back from the context. (llama_cpp.Llama makes a context of
its own first; replacing it meant two GPU backends made and one torn down before the
first token.) A model with no layers offloaded gets no GPU device at all, unless --device,
--split-mode or --main-gpu choose one: llama.cpp would otherwise add every GPU it finds,
start its backend in each context and send large CPU batches there. llama.cpp's log goes
through `route_log`: warnings and errors always, the rest with DUO_LLAMA_LOG=1; stdout and
stderr are never redirected, so a crash's trace still prints.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from shared.presets import ModelError

log = logging.getLogger("shared.llama.model")

ALL_LAYERS = 0x7FFFFFFF  # llama.cpp caps it at the model's layer count
LOG_ENV = "DUO_LLAMA_LOG"  # 1: llama.cpp's whole log on stderr (else warnings and errors)
GGML_LOG_INFO, GGML_LOG_WARN, GGML_LOG_ERROR, GGML_LOG_CONT = 2, 3, 4, 5  # ggml.h
_META_BUF = 1024
LOAD_MODES = {(True, True): llama_cpp.LLAMA_LOAD_MODE_MMAP_MLOCK,  # (mmap, mlock)
              (False, True): llama_cpp.LLAMA_LOAD_MODE_MLOCK,
              (False, False): llama_cpp.LLAMA_LOAD_MODE_NONE}


ROPE_SCALING = {"none": llama_cpp.LLAMA_ROPE_SCALING_TYPE_NONE,
                "linear": llama_cpp.LLAMA_ROPE_SCALING_TYPE_LINEAR,
                "yarn": llama_cpp.LLAMA_ROPE_SCALING_TYPE_YARN}


@dataclass(frozen=True)
class RopeScaling:
    """--rope-* and --yarn-*: None leaves llama.cpp's default, which means the model's own."""

    scaling: str | None = None  # none, linear, yarn
    freq_base: float | None = None
    freq_scale: float | None = None
    yarn_orig_ctx: int | None = None
    yarn_ext_factor: float | None = None
    yarn_attn_factor: float | None = None
    yarn_beta_slow: float | None = None
    yarn_beta_fast: float | None = None

    def fields(self) -> dict[str, float]:
        """llama_context_params' fields that were given, by their C names."""
        given = {"rope_scaling_type": ROPE_SCALING.get(self.scaling or ""),
                 "rope_freq_base": self.freq_base, "rope_freq_scale": self.freq_scale,
                 "yarn_orig_ctx": self.yarn_orig_ctx, "yarn_ext_factor": self.yarn_ext_factor,
                 "yarn_attn_factor": self.yarn_attn_factor,
                 "yarn_beta_slow": self.yarn_beta_slow, "yarn_beta_fast": self.yarn_beta_fast}
        return {name: value for name, value in given.items() if value is not None}


@dataclass(frozen=True)
class ContextShape:
    """What the one context holds: `n_seq` sequences over `n_ctx` cells in all."""

    n_ctx: int
    n_seq: int
    n_batch: int
    threads: int
    flash_attn: bool
    threads_batch: int = 0  # for prompt batches (0: threads)
    n_ubatch: int = 0  # a compute step within a batch (0: n_batch)
    kv_types: tuple[int, int] = (1, 1)  # ggml types of the cache's keys and values (f16)
    swa_full: bool = False  # a full-size cache for sliding-window layers
    rope: RopeScaling = RopeScaling()
    kv_offload: bool = True  # the KV cache on its layers' devices (-nkvo: host memory)
    op_offload: bool = True  # host tensors' operations offloaded to the device


@dataclass(frozen=True)
class Tuning:
    """llama-server's knobs beyond what lead and back choose themselves."""

    threads_batch: int = 0  # CPU threads for prompt batches (0: the threads)
    n_ubatch: int = 0  # tokens per compute step within a batch (0: the batch)
    mmap: bool = True  # map the file (else read it whole)
    mlock: bool = False  # keep the weights in RAM
    kv_types: tuple[int, int] = (1, 1)  # ggml types of the cache's keys and values (f16)
    swa_full: bool = False  # a full-size cache for sliding-window layers (--swa-full)
    devices: tuple[str, ...] | None = None  # --device's (None: llama.cpp's choice; (): none)
    overrides: tuple[tuple[str, str], ...] = ()  # (tensor pattern, buffer type name)
    split_mode: str | None = None  # --split-mode (None: llama.cpp's)
    main_gpu: int | None = None  # --main-gpu (None: llama.cpp's)
    rope: RopeScaling = RopeScaling()
    kv_offload: bool = True  # --no-kv-offload: False
    op_offload: bool = True  # --no-op-offload: False
    repack: bool = True  # llama.cpp's extra buffer types (--no-repack: False)
    check_tensors: bool = False  # check tensor data as it loads

    @property
    def places_devices(self) -> bool:
        """Whether the devices were chosen: then llama.cpp is told exactly that."""
        return (self.devices, self.split_mode, self.main_gpu) != (None, None, None)


SPLIT_MODES = {"none": llama_cpp.LLAMA_SPLIT_MODE_NONE, "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
               "row": llama_cpp.LLAMA_SPLIT_MODE_ROW, "tensor": llama_cpp.LLAMA_SPLIT_MODE_TENSOR}
NUMA = {"distribute": llama_cpp.GGML_NUMA_STRATEGY_DISTRIBUTE,
        "isolate": llama_cpp.GGML_NUMA_STRATEGY_ISOLATE,
        "numactl": llama_cpp.GGML_NUMA_STRATEGY_NUMACTL}


class BuftOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override (llama-cpp-python does not declare it)."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def model_params(n_gpu_layers: int, tensor_split: list[float] | None,
                 more: Tuning = Tuning()) -> tuple[llama_cpp.llama_model_params, Any]:
    """llama.cpp's model parameters, and the arrays they point to (keep them as long):
    the tensor split, --device's devices and --override-tensor's overrides. ModelError
    where a device or buffer type is not there."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
    if more.mlock or not more.mmap:
        params.load_mode = LOAD_MODES[more.mmap, more.mlock]
    params.use_extra_bufts, params.check_tensors = more.repack, more.check_tensors
    _choose_devices(params, n_gpu_layers, more)
    split = None
    if tensor_split:
        split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*tensor_split)
        params.tensor_split = split
    devices = None if more.devices is None else device_array(more.devices)
    overrides = override_array(more.overrides) if more.overrides else None
    params.devices = ctypes.addressof(devices) if devices is not None else None
    params.tensor_buft_overrides = ctypes.addressof(overrides) if overrides is not None else None
    return params, (split, devices, overrides)


def _choose_devices(params: llama_cpp.llama_model_params, n_gpu_layers: int,
                    more: Tuning) -> None:
    """--split-mode and --main-gpu as given; with neither (nor --device) and no layer
    offloaded, no device at all (split mode none with no main GPU clears llama.cpp's list)."""
    if n_gpu_layers == 0 and not more.places_devices:
        params.split_mode, params.main_gpu = llama_cpp.LLAMA_SPLIT_MODE_NONE, -1
    if more.split_mode is not None:
        params.split_mode = SPLIT_MODES[more.split_mode]
    if more.main_gpu is not None:
        params.main_gpu = more.main_gpu


def device_array(names: tuple[str, ...]) -> ctypes.Array[ctypes.c_void_p]:
    """The NULL-terminated ggml_backend_dev_t array of --device's names (just NULL: none)."""
    from shared.llama import ggml

    handles = ggml.device_handles(names)
    return (ctypes.c_void_p * (len(handles) + 1))(*handles, None)


def override_array(pairs: tuple[tuple[str, str], ...]) -> ctypes.Array[BuftOverride]:
    """llama.cpp's override array, ended by {NULL, NULL}; ModelError for a buffer type
    no device has."""
    from shared.llama import ggml

    types = ggml.buffer_types()
    for _, name in pairs:
        if name not in types:
            raise ModelError(f"--override-tensor: no buffer type {name!r} (buffer types: "
                             f"{', '.join(types)})")
    entries = [BuftOverride(pattern.encode(), types[name]) for pattern, name in pairs]
    return (BuftOverride * (len(pairs) + 1))(*entries)


def init_numa(strategy: str) -> None:
    """--numa: ggml's NUMA strategy, set before the model loads (as llama-server does)."""
    _ready()
    llama_cpp.llama_numa_init(NUMA[strategy])


def list_devices(rpc: str | None) -> str:
    """--list-devices' text, --rpc's servers' devices among them."""
    from shared.llama import ggml

    _ready()
    ggml.attach_rpc(rpc)
    return ggml.device_listing()


def context_params(shape: ContextShape) -> llama_cpp.llama_context_params:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = shape.n_ctx, shape.n_seq, True
    params.n_batch = min(shape.n_batch, shape.n_ctx)
    params.n_ubatch = min(shape.n_ubatch or params.n_batch, params.n_batch)
    params.n_threads, params.n_threads_batch = shape.threads, shape.threads_batch or shape.threads
    params.type_k, params.type_v = shape.kv_types
    params.swa_full = shape.swa_full
    for name, value in shape.rope.fields().items():
        setattr(params, name, value)
    params.offload_kqv, params.op_offload = shape.kv_offload, shape.op_offload
    params.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if shape.flash_attn
                              else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    return params


def load_weights(path: Path, params: llama_cpp.llama_model_params) -> Any:
    """The model's pointer; ModelError where llama.cpp cannot load the file."""
    if not path.is_file():
        raise ModelError(f"cannot load {path}: no such file")
    _ready()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    if not model:
        raise ModelError(f"cannot load {path}: llama.cpp could not read it as a model "
                         f"(is it a GGUF file? {LOG_ENV}=1 shows llama.cpp's log)")
    return model


def new_context(model: Any, shape: ContextShape, name: str) -> Any:
    """The model's one context; ModelError (the model freed) where it cannot be made."""
    context = llama_cpp.llama_init_from_model(model, context_params(shape))
    if not context:
        llama_cpp.llama_model_free(model)
        raise ModelError(f"cannot load {name}: a KV cache of {shape.n_ctx} tokens does not "
                         "fit: try a smaller --ctx-size (lead: or fewer --parallel slots; "
                         "without -np, or with -kvu, each keeps room for all of -c)")
    return context


def metadata(model: Any) -> dict[str, str]:
    """The GGUF's keys and values, as text."""
    out = {}
    for i in range(llama_cpp.llama_model_meta_count(model)):
        key = _meta_text(llama_cpp.llama_model_meta_key_by_index, model, i)
        out[key] = _meta_text(llama_cpp.llama_model_meta_val_str_by_index, model, i)
    return out


def _meta_text(read: Callable[..., int], model: Any, i: int) -> str:
    buffer = ctypes.create_string_buffer(_META_BUF)
    n = read(model, i, buffer, _META_BUF)
    if n >= _META_BUF:
        buffer = ctypes.create_string_buffer(n + 1)
        read(model, i, buffer, n + 1)
    return buffer.value.decode("utf-8", "replace")


def tokenize(vocab: Any, text: bytes, add_bos: bool, special: bool) -> list[int]:
    room = len(text) + 2
    tokens = (llama_cpp.llama_token * room)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, room, add_bos, special)
    if n < 0:  # -n: the room it needs
        room = -n
        tokens = (llama_cpp.llama_token * room)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), tokens, room, add_bos, special)
    if n < 0:
        raise RuntimeError(f"llama.cpp could not tokenize {len(text)} bytes")
    return list(tokens[:n])


_initialised = False


def _ready() -> None:
    """llama.cpp's backends initialised once, its log routed before anything logs."""
    global _initialised
    if not _initialised:
        llama_cpp.llama_log_set(route_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        spare_lavapipe()
        _initialised = True


SOFTWARE_VULKAN = "llvmpipe"  # Mesa's software Vulkan driver (lavapipe) names its device so
NO_FUSION = "GGML_VK_DISABLE_FUSION"


def spare_lavapipe() -> bool:
    """Turn ggml-vulkan's fused kernels off where a Vulkan device is lavapipe: its fused
    mat-vec + add crashes Debian 12's lavapipe (Mesa 22.3) on its queue thread, with no
    duo code involved and no validation error (docs/gpu.md). Read by ggml-vulkan when it
    creates the device, at the first model load. True where it was turned off here."""
    from shared.llama import ggml

    lavapipe = [name for name, _, about in ggml.devices()
                if name.startswith("Vulkan") and about.startswith(SOFTWARE_VULKAN)]
    if not lavapipe or NO_FUSION in os.environ:
        return False
    os.environ[NO_FUSION] = "1"
    log.warning("%s is Mesa's software Vulkan (lavapipe): ggml's fused kernels, which crash "
                "it, are off (%s=1)", lavapipe[0], NO_FUSION)
    return True


class LogRoute:
    """Where llama.cpp's log lines go: `hook` (set by shared/llama/model.py) may take a line;
    otherwise warnings and errors, and everything under DUO_LLAMA_LOG=1, go to stderr."""

    hook: Callable[[int, str], bool] | None = None
    _last_level = 0

    @classmethod
    def write(cls, level: int, text: str) -> None:
        level = cls._last_level if level == GGML_LOG_CONT else level
        cls._last_level = level
        if cls.hook is not None and cls.hook(level, text):
            return
        if level in (GGML_LOG_WARN, GGML_LOG_ERROR) or os.environ.get(LOG_ENV, "") not in ("", "0"):
            os.write(2, text.encode("utf-8", "replace"))


@llama_cpp.llama_log_callback
def route_log(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    LogRoute.write(level, text.decode("utf-8", "replace"))

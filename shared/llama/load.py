"""A model and its one context, made through llama.cpp's C API with their final parameters
(shared/llama/model.py builds on them; nothing else here touches llama.cpp's loading).

One context, made once: slots x (1 + branches) sequences in one unified KV cache of the
chosen size, its batch read back from the context. (llama_cpp.Llama makes a context of
its own first; replacing it meant two GPU backends made and one torn down before the
first token.) A model with no layers offloaded gets no GPU device at all: llama.cpp would
otherwise add every GPU it finds, start its backend in each context and send large CPU
batches there. llama.cpp's log goes through `route_log`: warnings and errors always, the
rest with DUO_LLAMA_LOG=1; stdout and stderr are never redirected, so a crash's trace
still prints.
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


@dataclass(frozen=True)
class Tuning:
    """llama-server's knobs beyond what lead and back choose themselves."""

    threads_batch: int = 0  # CPU threads for prompt batches (0: the threads)
    n_ubatch: int = 0  # tokens per compute step within a batch (0: the batch)
    mmap: bool = True  # map the file (else read it whole)
    mlock: bool = False  # keep the weights in RAM
    kv_types: tuple[int, int] = (1, 1)  # ggml types of the cache's keys and values (f16)
    swa_full: bool = False  # a full-size cache for sliding-window layers (--swa-full)


def model_params(n_gpu_layers: int, tensor_split: list[float] | None, mmap: bool = True,
                 mlock: bool = False) -> tuple[llama_cpp.llama_model_params, Any]:
    """llama.cpp's model parameters, and the tensor split array they point to (keep it).
    `mmap`: map the file (else read it); `mlock`: keep the weights in RAM."""
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = ALL_LAYERS if n_gpu_layers < 0 else n_gpu_layers
    if mlock or not mmap:
        params.load_mode = LOAD_MODES[mmap, mlock]
    if n_gpu_layers == 0:  # no device list at all: no GPU backend, no pinned host buffers
        params.split_mode, params.main_gpu = llama_cpp.LLAMA_SPLIT_MODE_NONE, -1
    split = None
    if tensor_split:
        split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*tensor_split)
        params.tensor_split = split
    return params, split


def context_params(shape: ContextShape) -> llama_cpp.llama_context_params:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = shape.n_ctx, shape.n_seq, True
    params.n_batch = min(shape.n_batch, shape.n_ctx)
    params.n_ubatch = min(shape.n_ubatch or params.n_batch, params.n_batch)
    params.n_threads, params.n_threads_batch = shape.threads, shape.threads_batch or shape.threads
    params.type_k, params.type_v = shape.kv_types
    params.swa_full = shape.swa_full
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
        raise ModelError(f"cannot load {name}: a context of {shape.n_ctx} tokens does not "
                         "fit: try a smaller --ctx-size")
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

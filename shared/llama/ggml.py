"""ggml calls llama-cpp-python does not bind: llama.cpp's RPC backend, ggml's abort hook,
and its devices and buffer types by name (--device, --override-tensor, --list-devices).

The RPC backend's calls (in the library llama-cpp-python ships once llama.cpp is built with
GGML_RPC=ON) are reached the way llama.cpp's own `--rpc` and `rpc-server` reach them,
through the RPC backend registry's proc addresses. Only shared.llama.model,
shared.llama.load and shared.rpc import this module.
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
from collections.abc import Callable

from llama_cpp.llama_cpp import _lib as libllama

from shared.presets import ModelError

REBUILD = ("reinstall llama-cpp-python with RPC on: make install (or CMAKE_ARGS='-DGGML_RPC=on' "
           "pip install --force-reinstall --no-cache-dir llama-cpp-python==0.3.36)")
DEVICE_TYPE_CPU, DEVICE_TYPE_GPU, DEVICE_TYPE_ACCEL = 0, 1, 3


def _bind(name: str, restype: object, *argtypes: object) -> Callable[..., object]:
    # Looked up through libllama, so these are the copies of ggml it links: a wheel holds
    # libggml.so and libggml.so.0 as two files, and each keeps a backend registry of its own.
    fn = getattr(libllama, name)
    fn.restype, fn.argtypes = restype, list(argtypes)
    return fn


_reg_by_name = _bind("ggml_backend_reg_by_name", ctypes.c_void_p, ctypes.c_char_p)
_proc_address = _bind("ggml_backend_reg_get_proc_address", ctypes.c_void_p,
                      ctypes.c_void_p, ctypes.c_char_p)
_register = _bind("ggml_backend_register", None, ctypes.c_void_p)
_load_all = _bind("ggml_backend_load_all", None)
_dev_count = _bind("ggml_backend_dev_count", ctypes.c_size_t)
_dev_get = _bind("ggml_backend_dev_get", ctypes.c_void_p, ctypes.c_size_t)
_dev_type = _bind("ggml_backend_dev_type", ctypes.c_int, ctypes.c_void_p)
_dev_name = _bind("ggml_backend_dev_name", ctypes.c_char_p, ctypes.c_void_p)
_dev_description = _bind("ggml_backend_dev_description", ctypes.c_char_p, ctypes.c_void_p)
_dev_by_name = _bind("ggml_backend_dev_by_name", ctypes.c_void_p, ctypes.c_char_p)
_dev_buffer_type = _bind("ggml_backend_dev_buffer_type", ctypes.c_void_p, ctypes.c_void_p)
_buft_name = _bind("ggml_backend_buft_name", ctypes.c_char_p, ctypes.c_void_p)
_dev_memory = _bind("ggml_backend_dev_memory", None, ctypes.c_void_p,
                    ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_AbortHook = ctypes.CFUNCTYPE(None, ctypes.c_char_p)
_set_abort_callback = _bind("ggml_set_abort_callback", ctypes.c_void_p, _AbortHook)
_AddServer = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)
_StartServer = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))


class RpcUnsupported(RuntimeError):
    """This llama.cpp build has no RPC backend."""


def _rpc_proc(name: str, prototype: type) -> Callable[..., object]:
    reg = _reg_by_name(b"RPC")
    address = _proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RpcUnsupported(f"this llama.cpp build has no RPC backend; {REBUILD}")
    return prototype(address)


def rpc_supported() -> bool:
    return bool(_reg_by_name(b"RPC"))


def add_rpc_server(endpoint: str) -> int:
    """Register a server's devices for the next model load; returns how many it has.
    The caller checks the server answers first: an unreachable one aborts the process."""
    reg = _rpc_proc("ggml_backend_rpc_add_server", _AddServer)(endpoint.encode())
    if not reg:
        return 0
    _register(reg)
    return sum(1 for dev in devices() if dev[2] == endpoint)


def devices() -> list[tuple[str, int, str]]:
    """(name, type, description) of every device ggml knows now."""
    found = []
    for i in range(_dev_count()):
        dev = _dev_get(i)
        found.append((_text(_dev_name(dev)), int(_dev_type(dev)), _text(_dev_description(dev))))
    return found


def offload_devices() -> list[str]:
    """The devices --device may name: every one but the CPU (llama-server's list)."""
    return [name for name, kind, _ in devices() if kind != DEVICE_TYPE_CPU]


def device_handles(names: tuple[str, ...]) -> list[int]:
    """--device's devices, looked up as llama-server looks them up (never the CPU, where
    a layer on no device stays anyway); ModelError naming those there are."""
    found = []
    for name in names:
        dev = _dev_by_name(name.encode())
        if not dev or _dev_type(dev) == DEVICE_TYPE_CPU:
            known = ", ".join(offload_devices()) or "none here"
            raise ModelError(f"--device: no device {name!r} to offload to (devices: {known}; "
                             "'none': offload nothing)")
        found.append(dev)
    return found


def buffer_types() -> dict[str, int]:
    """Each device's buffer type by the name --override-tensor gives it (CPU, CUDA0, ...)."""
    found = {}
    for i in range(_dev_count()):
        buft = _dev_buffer_type(_dev_get(i))
        if buft:
            found[_text(_buft_name(buft))] = buft
    return found


def device_listing() -> str:
    """--list-devices' text, as llama-server prints it."""
    lines = ["Available devices:"]
    for i in range(_dev_count()):
        dev = _dev_get(i)
        if _dev_type(dev) == DEVICE_TYPE_CPU:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        _dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        lines.append(f"  {_text(_dev_name(dev))}: {_text(_dev_description(dev))} "
                     f"({total.value >> 20} MiB, {free.value >> 20} MiB free)")
    return "\n".join(lines if len(lines) > 1 else [*lines, "  (none)"])


def start_rpc_server(endpoint: str, cache_dir: str | None, threads: int) -> None:
    """Serve this machine's accelerators (its CPU where it has none) until killed.
    Returns only when the server cannot start (llama.cpp prints why)."""
    _load_all()
    chosen = _served_devices()
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    start = _rpc_proc("ggml_backend_rpc_start_server", _StartServer)
    start(endpoint.encode(), cache_dir.encode() if cache_dir else None, threads,
          len(chosen), array)


def _served_devices() -> list[int]:
    every = [_dev_get(i) for i in range(_dev_count())]
    accelerators = [d for d in every
                    if _dev_type(d) not in (DEVICE_TYPE_CPU, DEVICE_TYPE_ACCEL)]
    return accelerators or [d for d in every if _dev_type(d) == DEVICE_TYPE_CPU][:1]


def served_device_names() -> list[str]:
    _load_all()
    return [f"{_text(_dev_name(d))} ({_text(_dev_description(d))})" for d in _served_devices()]


def _text(value: bytes | None) -> str:
    return (value or b"").decode("utf-8", "replace")


def exit_on_abort(who: str) -> None:
    """Turn a llama.cpp abort (an RPC server gone mid-decode, say) into one clear line and
    exit status 70 instead of a core dump. The hook runs on whichever thread aborted;
    the process could not go on from there, so it exits at once."""
    _set_abort_callback(_on_abort(who))


def _on_abort(who: str) -> ctypes._CFuncPtr:
    def hook(message: bytes | None) -> None:
        lines = _text(message).strip().splitlines() or ["(no message)"]
        reason = re.sub(r"^\S+:\d+: ", "", lines[0])  # drop llama.cpp's file:line
        sys.stderr.write(f"error: {who}: llama.cpp aborted: {reason}\n")
        sys.stderr.flush()
        os._exit(70)

    global _abort_hook  # kept: C holds the pointer
    _abort_hook = _AbortHook(hook)
    return _abort_hook


_abort_hook: ctypes._CFuncPtr | None = None


def attach_rpc(spec: str | None) -> list[str]:
    """Register --rpc servers before a model loads: its GPU layers then go to them."""
    if not spec:
        return []
    from shared.wire.rpc_endpoints import RpcError, hello, parse_endpoints

    if not rpc_supported():
        raise ModelError(f"--rpc: this llama-cpp-python has no RPC backend; {REBUILD}")
    try:
        endpoints = parse_endpoints(spec)
        for endpoint in endpoints:
            hello(endpoint)
    except RpcError as exc:
        raise ModelError(str(exc)) from None
    for endpoint in endpoints:
        if add_rpc_server(str(endpoint)) == 0:
            raise ModelError(f"RPC server {endpoint} offers no device")
    exit_on_abort(f"RPC {spec}")  # a server lost mid-decode aborts llama.cpp
    return [str(e) for e in endpoints]

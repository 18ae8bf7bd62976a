"""Where a model's weights go, as llama-server's flags say it: --device's names and
--override-tensor's (pattern, buffer type) pairs, with --cpu-moe's and --n-cpu-moe's
patterns exactly as llama.cpp's common/common.h writes them. Pure: the names are looked up
in ggml when the model loads (shared/llama/load.py), after --rpc has added its devices.
"""

from __future__ import annotations

import re

CPU = "CPU"  # the CPU's buffer type, as ggml names it
FFN_EXPS = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"  # a MoE layer's expert weights
FFN_DENSE = r"\.ffn_(up|down|gate)\."  # a dense layer's feed-forward weights
Overrides = tuple[tuple[str, str], ...]


def device_names(value: str | None) -> tuple[str, ...] | None:
    """--device's names (None: not given, llama.cpp chooses; (): 'none', no device)."""
    if value is None:
        return None
    names = tuple(name.strip() for name in value.split(","))
    if names == ("none",):
        return ()
    if "" in names or "none" in names:
        raise ValueError(f"{value!r}: device names, comma-separated (e.g. CUDA0,CUDA1), "
                         "or 'none' alone")
    return names


def tensor_overrides(value: str | None) -> Overrides:
    """--override-tensor's PATTERN=BUFFER_TYPE pairs, comma-separated; ValueError naming a
    part that is not one. A pattern is a regular expression searched in tensor names."""
    pairs: list[tuple[str, str]] = []
    for part in value.split(",") if value is not None else []:
        pattern, eq, buffer_type = part.partition("=")
        if not eq:
            raise ValueError(f"{part!r} is not PATTERN=BUFFER_TYPE (e.g. exps=CPU)")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{pattern!r} is not a regular expression: {exc}") from None
        pairs.append((pattern, buffer_type))
    return tuple(pairs)


def first_layers(n: int, ffn: str) -> Overrides:
    """The CPU for `ffn`'s weights in the first n layers (--n-cpu-moe, --n-cpu-ffn)."""
    return tuple((rf"blk\.{i}{ffn}", CPU) for i in range(n))


def all_overrides(given: str | None, n_cpu_moe: int = 0, n_cpu_ffn: int = 0,
                  cpu_moe: bool = False) -> Overrides:
    """Every override, in the order llama.cpp tries them (the first match wins): -ot's,
    then --n-cpu-moe's and --n-cpu-ffn's, then --cpu-moe's."""
    return (tensor_overrides(given) + first_layers(n_cpu_moe, FFN_EXPS)
            + first_layers(n_cpu_ffn, FFN_DENSE) + (((FFN_EXPS, CPU),) if cpu_moe else ()))

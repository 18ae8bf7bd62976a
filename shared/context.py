"""How many tokens one generation holds: its share of --ctx-size (`slot_share`) or, where
that is left to lead (and back), what an agent's prompt needs (Claude Code's first request
is ~27k tokens, Codex's ~6k) where the model was trained for it and the KV cache of every
slot fits in memory.

Pure: the model's metadata (its GGUF keys) and the memory in, a size and why out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

WANTED = 32768  # tokens a generation holds by default: an agent's prompt and its reply
SMALLEST = 4096  # never chosen below this (the default before agents)
MEMORY_SHARE = 4  # the KV cache may take up to a quarter of the machine's memory
F16 = 2  # bytes of a K or V value in llama.cpp's default cache type


@dataclass(frozen=True)
class Context:
    n_ctx: int  # tokens a generation holds
    why: str  # what decided it, for the log


def kv_bytes_per_token(meta: dict[str, Any]) -> int:
    """Bytes of K and V one token takes in the cache, over all layers (f16); 0 where the
    metadata does not say."""
    arch = meta.get("general.architecture", "")
    try:
        layers = int(meta[f"{arch}.block_count"])
        heads = int(meta[f"{arch}.attention.head_count"])
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
        width = int(meta[f"{arch}.embedding_length"]) // heads
        key = int(meta.get(f"{arch}.attention.key_length", width))
        value = int(meta.get(f"{arch}.attention.value_length", width))
    except (KeyError, ValueError, ZeroDivisionError):
        return 0
    return layers * kv_heads * (key + value) * F16


def trained(meta: dict[str, Any]) -> int:
    """The context the model was trained for (0: not said)."""
    arch = meta.get("general.architecture", "")
    try:
        return int(meta.get(f"{arch}.context_length", 0))
    except ValueError:
        return 0


def choose(meta: dict[str, Any], slots: int, memory: int) -> Context:
    """The context a generation gets: WANTED, or the model's own if smaller, halved until
    every slot's cache fits in a quarter of `memory` bytes, never below SMALLEST."""
    own = trained(meta)
    n_ctx = min(WANTED, own) if own else WANTED
    why = f"the model's own {own}" if own and own < WANTED else f"{WANTED} for agents' prompts"
    per_token, budget = kv_bytes_per_token(meta) * slots, memory // MEMORY_SHARE
    if per_token and memory:
        while n_ctx > SMALLEST and n_ctx * per_token > budget:
            n_ctx //= 2
            why = f"what {slots} slot(s) fit in a quarter of {gib(memory)} of memory"
    return Context(max(n_ctx, min(SMALLEST, own or SMALLEST)), why)


def slot_share(ctx_size: int, per_slot: int, slots: int, unified: bool) -> int:
    """The tokens a slot holds, as llama-server reads -c: the KV cache's total, each of
    `slots` holding its share, or all of it where `unified` (-kvu); `per_slot`
    (--kv-unified-per-slot) caps that, or without -c sizes it. 0: chosen (`choose`).
    ValueError where a share leaves a slot under 64 tokens."""
    if not ctx_size:
        return per_slot
    share = ctx_size if unified else ctx_size // max(slots, 1)
    share = min(share, per_slot) if per_slot else share
    if share < 64:
        raise ValueError(f"--ctx-size {ctx_size} over --parallel {slots} slots leaves each "
                         f"{share} tokens: give at least {64 * slots} (a slot holds at "
                         "least 64), or fewer slots")
    return share


def check_context(n_ctx: int) -> int:
    """--ctx-size: 0 (chosen) or at least 64 tokens."""
    if 0 < n_ctx < 64:
        raise ValueError("0 (chosen as the model and memory allow) or at least 64 tokens")
    return n_ctx


def physical_memory() -> int:
    """This machine's memory in bytes (0: unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def gib(n_bytes: int) -> str:
    return f"{n_bytes / (1 << 30):.1f} GiB"

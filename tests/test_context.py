"""The context a generation gets: its share of --ctx-size, or lead's choice where that is
left to it (shared/context.py)."""

from __future__ import annotations

import pytest

from shared.context import SMALLEST, WANTED, check_context, choose, kv_bytes_per_token, slot_share

GIB = 1 << 30
# Qwen2.5-Coder-1.5B's keys: 28 layers, 2 KV heads of 128 (28 KiB a token in f16)
QWEN = {"general.architecture": "qwen2", "qwen2.block_count": 28,
        "qwen2.attention.head_count": 12, "qwen2.attention.head_count_kv": 2,
        "qwen2.embedding_length": 1536, "qwen2.context_length": 32768}


def test_a_token_s_cache_is_its_layers_kv_heads_and_widths_in_f16() -> None:
    assert kv_bytes_per_token(QWEN) == 28 * 2 * (128 + 128) * 2 == 28 * 1024
    assert kv_bytes_per_token({**QWEN, "qwen2.attention.key_length": 192,
                               "qwen2.attention.value_length": 128}) == 28 * 2 * 320 * 2
    assert kv_bytes_per_token({"general.architecture": "x"}) == 0  # not said: unknown


def test_an_agent_s_prompt_fits_where_the_model_and_memory_allow() -> None:
    assert choose(QWEN, slots=4, memory=24 * GIB).n_ctx == WANTED == 32768  # 3.5 GiB


def test_a_model_trained_for_less_gets_its_own() -> None:
    small = {**QWEN, "qwen2.context_length": 8192}
    chosen = choose(small, slots=4, memory=24 * GIB)
    assert chosen.n_ctx == 8192 and "8192" in chosen.why


def test_the_cache_is_halved_until_it_fits_a_quarter_of_memory() -> None:
    chosen = choose(QWEN, slots=4, memory=8 * GIB)  # 2 GiB: 16k tokens x 4 slots is 1.75
    assert chosen.n_ctx == 16384 and "memory" in chosen.why
    assert choose(QWEN, slots=64, memory=1 * GIB).n_ctx == SMALLEST  # never below


def test_unknown_memory_or_geometry_keeps_the_wanted_size() -> None:
    assert choose(QWEN, slots=4, memory=0).n_ctx == WANTED
    assert choose({"general.architecture": "x"}, slots=4, memory=GIB).n_ctx == WANTED


@pytest.mark.parametrize(("given", "ok"), [(0, True), (64, True), (63, False), (1, False)])
def test_ctx_size_is_chosen_or_at_least_64(given: int, ok: bool) -> None:
    if ok:
        assert check_context(given) == given
    else:
        with pytest.raises(ValueError, match="at least 64"):
            check_context(given)


@pytest.mark.parametrize(("ctx", "per_slot", "slots", "unified", "share"), [
    (2048, 0, 2, False, 1024),  # llama-server's -c 2048 -np 2: 1024 a slot
    (256, 0, 4, False, 64),
    (1000, 0, 3, False, 333),
    (2048, 0, 4, True, 2048),  # -kvu (or -np auto): any slot may fill the cache
    (2048, 512, 2, False, 512),  # --kv-unified-per-slot caps the share
    (2048, 4096, 2, False, 1024),  # ... never above it
    (0, 4096, 4, False, 4096),  # without -c it sizes a slot: the cache is 4 x 4096
    (0, 0, 4, True, 0),  # neither: lead chooses
])
def test_a_slot_holds_its_share_of_ctx_size_as_llama_server_splits_it(
        ctx: int, per_slot: int, slots: int, unified: bool, share: int) -> None:
    assert slot_share(ctx, per_slot, slots, unified) == share


def test_a_share_under_64_tokens_is_refused_naming_the_flags() -> None:
    with pytest.raises(ValueError, match="--ctx-size 200 over --parallel 4 .* at least 256"):
        slot_share(200, 0, 4, False)
    assert slot_share(200, 0, 4, True) == 200  # one slot may hold all 200

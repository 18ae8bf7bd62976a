"""Random-weight GGUFs of real shapes: the default pair's shapes match their files, a small
model generated here loads in llama.cpp and gives finite logits, and its blocks carry the
scales the generator sets (no NaN, no denormals)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gguf", reason="gguf is in the test extra: make install")
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

from device.gguf_gen import SCALES, Filler, random_blocks, write_model  # noqa: E402
from device.shapes import SHAPES, Tensor, file_bytes, more_bits, tensors  # noqa: E402
from shared.presets import PRESETS, cache_dir  # noqa: E402

LETTERS = "abcdefghijklmnop"


def byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: one printable character per byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(len(extra))]


def tiny_vocab(path: Path) -> int:
    """A GPT-2-style tokenizer of 514 tokens (bytes, letter pairs, two end tokens)."""
    merges = [f"{x} {y}" for x in LETTERS for y in LETTERS]
    tokens = [*byte_tokens(), *(m.replace(" ", "") for m in merges), "<|endoftext|>",
              "<|im_end|>"]
    w = GGUFWriter(path, "qwen2")
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_string("tokenizer.ggml.pre", "qwen2")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [1] * (len(tokens) - 2) + [3, 3])
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.eos_token_id", len(tokens) - 1)
    w.add_uint32("tokenizer.ggml.bos_token_id", len(tokens) - 2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return len(tokens)


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    """(vocabulary, model) of the rehearsal's draft shape over the tiny vocabulary."""
    vocab = tmp_path / "vocab.gguf"
    shape = replace(SHAPES["tiny-draft"], n_vocab=tiny_vocab(vocab))
    model = tmp_path / "model.gguf"
    write_model(shape, vocab, model)
    return vocab, model


def test_more_bits_in_as_many_layers_as_the_default_pairs_files() -> None:
    # counted in the files: 14 of 28 layers of the 1.5B, 12 of 24 of the 0.5B
    assert sum(more_bits(i, 28) for i in range(28)) == 14
    assert sum(more_bits(i, 24) for i in range(24)) == 12


def test_the_default_pairs_shapes_weigh_what_their_files_do() -> None:
    # the tensors' bytes of the two GGUFs (shared/presets.py), headers aside
    assert file_bytes(SHAPES["qwen2.5-coder-1.5b"]) == 1_111_370_240
    assert file_bytes(SHAPES["qwen2.5-coder-0.5b"]) == 485_452_288
    assert 18 < file_bytes(SHAPES["qwen2.5-32b"]) / 2**30 < 19.5  # a 32B at Q4_K_M


def test_the_default_target_shape_is_its_file_tensor_for_tensor() -> None:
    path = cache_dir() / PRESETS["qwen2.5-coder-1.5b"].filename
    if not path.exists():
        pytest.skip(f"{path.name} is not installed (make models)")
    real = {t.name: (tuple(int(d) for d in t.shape[::-1]), t.tensor_type)
            for t in GGUFReader(path).tensors}
    mine = {t.name: (t.shape, t.qtype) for t in tensors(SHAPES["qwen2.5-coder-1.5b"])}
    assert {k: v[0] for k, v in real.items()} == {k: v[0] for k, v in mine.items()}
    count = lambda d: sorted((v[1], k.split(".")[-2]) for k, v in d.items())  # noqa: E731
    assert count(real) == count(mine)


def test_every_quantized_row_is_whole_blocks() -> None:
    for shape in SHAPES.values():
        for t in tensors(shape):
            assert t.shape[-1] % GGML_QUANT_SIZES[t.qtype][0] == 0, (shape.name, t.name)


@pytest.mark.parametrize("qtype", sorted(SCALES))
def test_random_blocks_carry_the_set_scales(qtype: Q) -> None:
    blocks = random_blocks(qtype, 64, np.random.default_rng(1))
    assert blocks.shape == (64, GGML_QUANT_SIZES[qtype][1])
    for offset, value in SCALES[qtype]:
        scales = blocks[:, offset:offset + 2].copy().view(np.float16)
        assert np.all(scales == np.float16(value))
        assert np.all(np.abs(scales.astype(np.float32)) >= np.finfo(np.float16).tiny)


def test_a_tensor_is_filled_to_its_exact_size() -> None:
    t = Tensor("blk.0.ffn_down.weight", (96, 512), Q.Q6_K)
    data = Filler().data(t)
    assert data.nbytes == 96 * 2 * GGML_QUANT_SIZES[Q.Q6_K][1]
    with pytest.raises(ValueError, match="whole"):
        Filler().data(Tensor("x", (4, 100), Q.Q4_K))


def test_the_generated_file_lists_the_shapes_tensors_and_tokenizer(tiny) -> None:
    vocab, model = tiny
    reader = GGUFReader(model)
    listed = {t.name: (tuple(int(d) for d in t.shape[::-1]), t.tensor_type)
              for t in reader.tensors}
    shape = replace(SHAPES["tiny-draft"], n_vocab=514)
    assert listed == {t.name: (t.shape, t.qtype) for t in tensors(shape)}
    assert reader.fields["tokenizer.ggml.tokens"].contents() == \
        GGUFReader(vocab).fields["tokenizer.ggml.tokens"].contents()
    assert reader.fields["qwen2.block_count"].contents() == shape.n_layer


def test_llama_cpp_loads_it_and_its_logits_are_finite(tiny) -> None:
    from shared.llama.model import LlamaModel

    model = LlamaModel(tiny[1], threads=1, n_ctx=64)
    try:
        ids = model.tokenize("hello world", add_bos=False)
        rows = model.evaluate(ids, len(ids))
        assert rows.shape == (len(ids), 514)
        assert np.isfinite(rows).all() and rows.std() > 0
    finally:
        model.close()


def test_a_shape_and_a_vocabulary_of_other_sizes_are_refused(tiny, tmp_path) -> None:
    with pytest.raises(ValueError, match="tokens"):
        write_model(SHAPES["tiny-draft"], tiny[0], tmp_path / "x.gguf")

"""Model shapes for random-weight GGUFs: the default pair's, a 32B target's, and small ones
for the rehearsal on a CPU. A shape names every tensor of a Qwen2 model with its dimensions
and quantization type; the types follow llama.cpp's Q4_K_M rule (more bits for attn_v and
ffn_down in the first and last eighth of the layers and every third between). For the
default pair this gives their files' tensors, shapes and bytes exactly, and as many tensors
of each type; the files put the extra bits in a few other layers (tests/test_device_gguf.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf import GGMLQuantizationType as Q

QWEN_VOCAB = 151936  # the default pair's tokenizer; the generated models all share it


@dataclass(frozen=True)
class Mix:
    """Quantization types by tensor role; `more` for attn_v / ffn_down where more bits."""

    embd: Q
    output: Q
    matrix: Q  # attn_q, attn_k, attn_output, ffn_gate, ffn_up
    attn_v: Q
    attn_v_more: Q
    ffn_down: Q
    ffn_down_more: Q
    file_type: int  # general.file_type as llama.cpp writes it


Q4_K_M = Mix(Q.Q4_K, Q.Q6_K, Q.Q4_K, Q.Q4_K, Q.Q6_K, Q.Q4_K, Q.Q6_K, 15)
# the default draft (AWQ-derived, mostly Q5_0; its file says 15 too)
Q5_0_MIX = Mix(Q.Q5_0, Q.Q8_0, Q.Q5_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, 15)


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    mix: Mix = Q4_K_M
    n_vocab: int = QWEN_VOCAB
    n_ctx_train: int = 32768

    @property
    def n_embd_kv(self) -> int:
        return self.n_embd // self.n_head * self.n_head_kv


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order: rows, then the row (quantized along it)
    qtype: Q


SHAPES = {s.name: s for s in (
    # the default pair (their GGUFs' own dimensions)
    Shape("qwen2.5-coder-1.5b", 28, 1536, 8960, 12, 2),
    Shape("qwen2.5-coder-0.5b", 24, 896, 4864, 14, 2, Q5_0_MIX),
    # a large target: Qwen2.5-32B's dimensions at Q4_K_M (~19 GB; its own vocabulary has
    # 152064 rows, this one the default pair's 151936)
    Shape("qwen2.5-32b", 64, 5120, 27648, 40, 8),
    # small shapes for the rehearsal on a CPU: K-quants need rows of 256
    Shape("tiny-target", 4, 256, 768, 4, 2),
    Shape("tiny-draft", 2, 256, 512, 4, 2, Q5_0_MIX),
    Shape("tiny-large", 8, 512, 1536, 8, 2),
)}


def more_bits(layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth, and every third between."""
    eighth = n_layer // 8
    return layer < eighth or layer >= 7 * n_layer // 8 or (layer - eighth) % 3 == 2


def tensors(s: Shape) -> list[Tensor]:
    """Every tensor of the shape (llama.cpp finds them by name, in any order)."""
    m = s.mix
    out = [Tensor("token_embd.weight", (s.n_vocab, s.n_embd), m.embd)]
    for i in range(s.n_layer):
        more = more_bits(i, s.n_layer)
        b = f"blk.{i}."
        out += [
            Tensor(b + "attn_norm.weight", (s.n_embd,), Q.F32),
            Tensor(b + "attn_q.weight", (s.n_embd, s.n_embd), m.matrix),
            Tensor(b + "attn_q.bias", (s.n_embd,), Q.F32),
            Tensor(b + "attn_k.weight", (s.n_embd_kv, s.n_embd), m.matrix),
            Tensor(b + "attn_k.bias", (s.n_embd_kv,), Q.F32),
            Tensor(b + "attn_v.weight", (s.n_embd_kv, s.n_embd),
                   m.attn_v_more if more else m.attn_v),
            Tensor(b + "attn_v.bias", (s.n_embd_kv,), Q.F32),
            Tensor(b + "attn_output.weight", (s.n_embd, s.n_embd), m.matrix),
            Tensor(b + "ffn_norm.weight", (s.n_embd,), Q.F32),
            Tensor(b + "ffn_gate.weight", (s.n_ff, s.n_embd), m.matrix),
            Tensor(b + "ffn_up.weight", (s.n_ff, s.n_embd), m.matrix),
            Tensor(b + "ffn_down.weight", (s.n_embd, s.n_ff),
                   m.ffn_down_more if more else m.ffn_down),
        ]
    out += [Tensor("output_norm.weight", (s.n_embd,), Q.F32),
            Tensor("output.weight", (s.n_vocab, s.n_embd), m.output)]
    return out


def metadata(s: Shape) -> dict[str, tuple[str, float | int | str]]:
    """The model's own keys (the tokenizer's come from the vocabulary GGUF): key -> (kind,
    value), kind naming the GGUFWriter method."""
    a = "qwen2."
    return {
        "general.name": ("string", f"{s.name} (random weights, duo device check)"),
        "general.file_type": ("uint32", s.mix.file_type),
        "general.quantization_version": ("uint32", 2),
        a + "block_count": ("uint32", s.n_layer),
        a + "context_length": ("uint32", s.n_ctx_train),
        a + "embedding_length": ("uint32", s.n_embd),
        a + "feed_forward_length": ("uint32", s.n_ff),
        a + "attention.head_count": ("uint32", s.n_head),
        a + "attention.head_count_kv": ("uint32", s.n_head_kv),
        a + "rope.freq_base": ("float32", 1e6),
        a + "attention.layer_norm_rms_epsilon": ("float32", 1e-6),
    }


def file_bytes(s: Shape) -> int:
    """The weights' bytes (the file adds its keys and padding)."""
    from gguf import GGML_QUANT_SIZES

    total = 0
    for t in tensors(s):
        block, size = GGML_QUANT_SIZES[t.qtype]
        n = 1
        for d in t.shape:
            n *= d
        total += n // block * size
    return total

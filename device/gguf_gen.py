"""python -m device.gguf_gen: a random-weight GGUF of a real shape (device/shapes.py).

Timing depends on the shapes and the quantization types, not on the weights' values, so a
GGUF of random blocks prices a 32B target as well as the real one. Each block's scales are
set so that a weight is about 0.02 (normal floats, no NaN or denormals: those would change
the timing on a CPU), the quantized values are random, and a few MiB of random blocks are
repeated to fill a tensor (a 19 GB file is written at disk speed, not numpy's random speed).
The tokenizer is copied from a vocabulary GGUF (python -m device.pack's vocab.gguf).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFValueType, GGUFWriter
from gguf import GGMLQuantizationType as Q

from device.shapes import SHAPES, Shape, Tensor, metadata, tensors

BASE_BLOCKS = 1 << 15  # random blocks per type, repeated through each tensor
# (type, byte offset, scale): the f16 scales in a block, chosen so weights are ~0.02
SCALES: dict[Q, tuple[tuple[int, float], ...]] = {
    Q.Q4_K: ((0, 1e-4), (2, 7.5e-4)),  # d, dmin (dmin * m centres d * sc * q)
    Q.Q6_K: ((208, 1e-4),),  # d after ql, qh, scales
    Q.Q5_0: ((0, 2e-3),),
    Q.Q8_0: ((0, 2.5e-4),),
    Q.Q4_0: ((0, 4e-3),),
}
Q6_K_SCALES = slice(192, 208)  # int8 sub-block scales: kept at 1..15


def random_blocks(qtype: Q, n: int, rng: np.random.Generator) -> np.ndarray:
    """n random blocks of a quantized type, (n, type_size) bytes, with sane scales."""
    _, size = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, Q6_K_SCALES] = rng.integers(1, 16, (n, 16), dtype=np.uint8)
    for offset, value in SCALES[qtype]:
        blocks[:, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return blocks


class Filler:
    """Tensor data: random blocks per type, made once and repeated."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.base: dict[Q, np.ndarray] = {}

    def data(self, t: Tensor) -> np.ndarray:
        if t.qtype == Q.F32:
            if t.name.endswith(".bias"):
                return np.zeros(t.shape, np.float32)
            return np.ones(t.shape, np.float32)  # norms
        if t.qtype == Q.F16:
            return (self.rng.standard_normal(t.shape) * 0.02).astype(np.float16)
        block, size = GGML_QUANT_SIZES[t.qtype]
        rows, row = int(np.prod(t.shape[:-1])), t.shape[-1]
        if row % block:
            raise ValueError(f"{t.name}: a row of {row} is not whole {t.qtype.name} blocks")
        if t.qtype not in self.base:
            self.base[t.qtype] = random_blocks(t.qtype, BASE_BLOCKS, self.rng)
        n = rows * (row // block)
        return np.resize(self.base[t.qtype], (n, size)).reshape(rows, row // block * size)


Field = tuple[str, Any, GGUFValueType, GGUFValueType | None]  # key, value, type, item type


def read_fields(reader: GGUFReader, prefixes: Iterable[str]) -> list[Field]:
    """Every key starting with one of `prefixes`, as GGUFWriter.add_key_value takes it."""
    out = []
    for key, field in reader.fields.items():
        if key.startswith(tuple(prefixes)):
            kind = field.types[0]
            out.append((key, field.contents(), kind,
                        field.types[-1] if kind == GGUFValueType.ARRAY else None))
    return out


def copy_fields(reader: GGUFReader, writer: GGUFWriter, prefixes: Iterable[str]) -> int:
    """Copy every key starting with one of `prefixes`; how many."""
    fields = read_fields(reader, prefixes)
    for field in fields:
        writer.add_key_value(*field)
    return len(fields)


@dataclass(frozen=True)
class Vocab:
    """A tokenizer read once (151,936 tokens and as many merges take seconds to read)."""

    fields: list[Field]
    n_tokens: int

    @classmethod
    def read(cls, path: Path) -> Vocab:
        fields = read_fields(GGUFReader(path), ("tokenizer.",))
        tokens = next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens")
        return cls(fields, len(tokens))


def add_metadata(writer: GGUFWriter, shape: Shape) -> None:
    for key, (kind, value) in metadata(shape).items():
        getattr(writer, f"add_{kind}")(key, value)


def write_model(shape: Shape, vocab: Vocab | Path, out: Path, seed: int = 0) -> int:
    """The GGUF; its size in bytes."""
    if isinstance(vocab, Path):
        vocab = Vocab.read(vocab)
    if shape.n_vocab != vocab.n_tokens:
        raise ValueError(f"{shape.name} has {shape.n_vocab} tokens, the vocabulary "
                         f"{vocab.n_tokens}")
    listed = tensors(shape)
    filler = Filler(seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = GGUFWriter(out, "qwen2")
    add_metadata(writer, shape)
    for field in vocab.fields:
        writer.add_key_value(*field)
    for t in listed:
        if t.qtype in (Q.F32, Q.F16):
            dtype = np.float32 if t.qtype == Q.F32 else np.float16
            nbytes = int(np.prod(t.shape)) * np.dtype(dtype).itemsize
            writer.add_tensor_info(t.name, t.shape, np.dtype(dtype), nbytes)
        else:
            block, size = GGML_QUANT_SIZES[t.qtype]
            byte_shape = (*t.shape[:-1], t.shape[-1] // block * size)
            writer.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8),
                                   int(np.prod(byte_shape)), raw_dtype=t.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in listed:  # one tensor in memory at a time
        writer.write_tensor_data(filler.data(t))
    writer.close()
    return out.stat().st_size


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.gguf_gen",
                                description=__doc__.splitlines()[0])
    p.add_argument("shape", choices=sorted(SHAPES), nargs="+")
    p.add_argument("--vocab", required=True, help="a GGUF whose tokenizer the models take")
    p.add_argument("--out", required=True, help="folder: SHAPE.gguf each")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    out, vocab = Path(a.out), Vocab.read(Path(a.vocab))
    for name in a.shape:
        t0 = time.monotonic()
        size = write_model(SHAPES[name], vocab, out / f"{name}.gguf", a.seed)
        print(f"{name}.gguf: {size / 2**30:.2f} GiB in {time.monotonic() - t0:.1f} s",
              file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

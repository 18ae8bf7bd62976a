"""python -m device.measure: what one evaluation of b tokens costs, one model, one placement.

The model is loaded as lead and back load theirs (shared/llama/model.py: flash attention on where
layers are offloaded); a prefix of `--prefix` tokens stands for a prompt, then each batch
size is evaluated after it, logits for every token (as lead verifies), `--repeats` rounds of
all sizes after one untimed round (CUDA picks kernels and captures graphs per shape on first
use). It stops at `--deadline-s`, keeping the rounds it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np


def ranges(text: str) -> list[int]:
    """'1-16,24,32' -> [1, ..., 16, 24, 32]."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return sorted(set(out))


def parse_sizes(text: str) -> list[int]:
    sizes = ranges(text)
    if not sizes or sizes[0] < 1:
        raise argparse.ArgumentTypeError(f"batch sizes are 1 or more: {text!r}")
    return sizes


def parse_cpus(text: str) -> set[int]:
    return set(ranges(text)) if text else set()


def timed_round(model, prefix: int, sizes: list[int], tokens: list[int],
                nonfinite: list[int]) -> dict[int, float]:
    """Each size once after the prefix: seconds. Batch sizes whose logits were not all finite
    go to `nonfinite` (random weights should not overflow; timing does not care, the
    report says so)."""
    out = {}
    for b in sizes:
        model.truncate(prefix)
        t0 = time.perf_counter()
        rows = model.evaluate(tokens[:b], b)
        out[b] = time.perf_counter() - t0
        if not np.isfinite(rows).all() and b not in nonfinite:
            nonfinite.append(b)
    return out


def measure(a: argparse.Namespace) -> dict:
    from shared.llama.model import load_model

    t0 = time.monotonic()
    deadline = t0 + a.deadline_s
    sizes = parse_sizes(a.sizes)
    model = load_model(a.model, a.threads, a.ngl, a.prefix + max(sizes) + 16)
    loaded = time.monotonic() - t0
    tokens = [1000 + (7 * i) % 5000 for i in range(max(sizes) + a.prefix)]
    model.truncate(0)
    model.evaluate(tokens[: a.prefix], 1)
    samples: dict[int, list[float]] = {b: [] for b in sizes}
    nonfinite: list[int] = []
    timed_round(model, a.prefix, sizes, tokens[a.prefix:], nonfinite)  # warm-up, untimed
    rounds = 0
    while rounds < a.repeats and time.monotonic() < deadline:
        for b, s in timed_round(model, a.prefix, sizes, tokens[a.prefix:], nonfinite).items():
            samples[b].append(s)
        rounds += 1
    model.close()
    return {"label": a.label, "model": a.model, "ngl": a.ngl, "threads": a.threads,
            "cpus": a.cpus, "prefix": a.prefix, "load_s": loaded, "rounds": rounds,
            "nonfinite_logits_at": nonfinite, "samples": samples}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.measure",
                                description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="GGUF path")
    p.add_argument("--label", required=True, help="the placement's name in the price table")
    p.add_argument("--ngl", type=int, default=0, help="layers on the GPU (-1: all)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads (0: one per CPU)")
    p.add_argument("--cpus", default="", help="pin to these CPUs first, e.g. 2-15")
    p.add_argument("--sizes", default="1-17,24,32,48,64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--prefix", type=int, default=256, help="tokens in the cache before each")
    p.add_argument("--deadline-s", type=float, default=120)
    p.add_argument("--out", required=True, help="JSON file")
    a = p.parse_args(argv)
    cpus = parse_cpus(a.cpus)
    if cpus:
        os.sched_setaffinity(0, cpus)  # before llama.cpp makes its threads
        a.threads = a.threads or len(cpus)
    result = measure(a)
    Path(a.out).write_text(json.dumps(result, indent=1))
    one = sorted(result["samples"][1])[len(result["samples"][1]) // 2] if result["rounds"] else 0
    print(f"{a.label}: load {result['load_s']:.1f} s, {result['rounds']} rounds, "
          f"b=1 {one * 1e3:.2f} ms", file=sys.stderr)


if __name__ == "__main__":
    main()

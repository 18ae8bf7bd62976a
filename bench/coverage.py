"""python -m bench.coverage: where the draft is wrong, is the target's token its next choice?

The target decodes the benchmark's prompts greedily; the draft reads each reply in one
batch, so that at every position it sees the target's own context. At each position the
target's token has a rank among the draft's logits (0: the draft's argmax, a draft token
lead accepts). Acceptance is the share of rank 0; coverage at width m is, among the other
positions (rejections), the share where the target's token is among the draft's next m
choices (ranks 1..m): a back that drafts m branches off each draft position would have
the correction's branch ready after that share of rejections. Ranks, not times: the
machine's load does not change what this prints.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench import prompts as bench_prompts

WIDTHS = (1, 2, 3)  # branches per draft position: 2nd choice, 2nd-3rd, 2nd-4th
# Coverage at m=1 (the draft's 2nd choice) on the default pair: 0.68 of 62 rejections
# (6 prompts x 96 tokens, 2026-11-24, Intel Xeon), rounded: `python -m bench --cover`.
MEASURED_COVER = 0.7
N_CTX = 2048


def rank_of(row: np.ndarray, token: int) -> int:
    """The token's place in the draft's row: 0 for its argmax (ties go to the lower id, as
    np.argmax breaks them), 1 for its second choice, ..."""
    value = row[token]
    return int(np.count_nonzero(row > value) + np.count_nonzero(row[:token] == value))


def ranks(rows: Sequence[np.ndarray], tokens: Sequence[int]) -> list[int]:
    """The rank of each target token in the draft's row for its position."""
    return [rank_of(row, t) for row, t in zip(rows, tokens, strict=True)]


@dataclass(frozen=True)
class Coverage:
    positions: int
    accepted: int  # the draft's argmax was the target's token
    within: dict[int, int] = field(default_factory=dict)  # m -> rejections with rank <= m

    @property
    def rejections(self) -> int:
        return self.positions - self.accepted

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.positions if self.positions else None

    def cover(self, m: int) -> float | None:
        """Share of rejections whose correction is among the draft's next m choices."""
        return self.within[m] / self.rejections if self.rejections else None


def tally(rank_list: Iterable[int], widths: Sequence[int] = WIDTHS) -> Coverage:
    seen = list(rank_list)
    return Coverage(len(seen), seen.count(0),
                    {m: sum(1 for r in seen if 0 < r <= m) for m in widths})


def _share(x: float | None) -> str:
    return f"{x:.2f}" if x is not None else "-"


def table(by_kind: dict[str, list[int]], widths: Sequence[int] = WIDTHS) -> str:
    """One row per prompt kind and one for all: acceptance, then coverage at each width."""
    head = "| prompts | positions | acceptance | rejections | " + " | ".join(
        f"m={m} ({_choices(m)})" for m in widths) + " |"
    lines = [head, "|---|---|---|---|" + "---|" * len(widths)]
    rows = {**by_kind, "all": [r for rs in by_kind.values() for r in rs]}
    for kind, rank_list in rows.items():
        c = tally(rank_list, widths)
        lines.append(f"| {kind} | {c.positions} | {_share(c.acceptance)} | {c.rejections} | "
                     + " | ".join(_share(c.cover(m)) for m in widths) + " |")
    return "\n".join(lines)


def _choices(m: int) -> str:
    return "2nd choice" if m == 1 else f"2nd-{m + 1}th" if m > 2 else "2nd-3rd"


def machine() -> str:
    """The CPU's model name, as lscpu gives it."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    names = [line.split(":", 1)[1].strip() for line in out.splitlines()
             if line.startswith("Model name:")]
    return names[0] if names else "unknown CPU"


def commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + (" (with uncommitted changes)" if dirty.strip() else "")


def measure(target_path: Path, draft_path: Path, chosen: list[dict], tokens: int,
            threads: int) -> dict[str, list[int]]:
    """Prompt kind -> the rank of every target token in the draft's rows (both models
    loaded in this process, one after the other evaluating)."""
    from bench.advise import chat_ids, greedy_reply
    from shared.llama.model import LlamaModel

    target = LlamaModel(target_path, threads, 0, N_CTX)
    draft = LlamaModel(draft_path, threads, 0, N_CTX)
    try:
        if (draft.n_vocab, draft.fingerprint()) != (target.n_vocab, target.fingerprint()):
            sys.exit("python -m bench.coverage: error: the draft has another token table")
        by_kind: dict[str, list[int]] = {}
        for i, prompt in enumerate(chosen):
            ids = chat_ids(target, prompt["text"])
            reply = greedy_reply(target, ids, tokens)
            draft.truncate(0)
            rows = draft.evaluate(ids + reply[:-1], len(reply))
            by_kind.setdefault(prompt["kind"], []).extend(ranks(rows, reply))
            print(f"  prompt {i + 1}/{len(chosen)} ({prompt['kind']}): {len(reply)} tokens",
                  file=sys.stderr, flush=True)
    finally:
        target.close()
        draft.close()
    return by_kind


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.coverage",
                                description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="preset name or GGUF path")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b", help="preset name or GGUF path")
    p.add_argument("--prompts", type=int, default=6,
                   help="N prompts of bench/prompts.json, taken from each kind in turn")
    p.add_argument("--tokens", type=int, default=96, help="target tokens per prompt")
    p.add_argument("--threads", type=int, default=0, help="threads per model (0: every CPU)")
    p.add_argument("--quick", action="store_true",
                   help="SmolLM2 as target and draft, 2 prompts, 24 tokens (exercises the code)")
    a = p.parse_args(argv)
    if a.quick:
        a.target = a.draft = "smollm2-135m"
        a.prompts, a.tokens = 2, 24
    if a.prompts < 1 or a.tokens < 1:
        p.error("--prompts and --tokens must be at least 1")
    return a


def main(argv: list[str] | None = None) -> None:
    from shared.presets import ModelError, resolve_model

    a = parse(argv)
    chosen = bench_prompts.spread(bench_prompts.load(), a.prompts)
    try:
        by_kind = measure(resolve_model(a.target), resolve_model(a.draft), chosen, a.tokens,
                          a.threads)
    except ModelError as exc:
        sys.exit(f"python -m bench.coverage: error: {exc}")
    print(f"\ntarget {a.target}, draft {a.draft}; {len(chosen)} prompts x up to {a.tokens} "
          f"greedy tokens; {machine()}; commit {commit()}\n")
    print(table(by_kind))
    print("\nm: branches per draft position; coverage at m: share of rejections whose "
          "correction is among the draft's next m choices")


if __name__ == "__main__":
    main()

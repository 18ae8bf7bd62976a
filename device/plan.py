"""What the check runs on each kind of device: the models, the price runs, the serve check's
placement, the placements predicted. DEVICE=cuda is the lent H100 (16 cores); DEVICE=cpu is
the rehearsal on this machine (2 cores, small shapes, the same steps)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PriceRun:
    label: str  # the row of the price table
    shape: str  # device/shapes.py
    ngl: int  # layers on the GPU (-1: all)
    cpus: str  # pinned there, one thread each
    sizes: str  # batch sizes
    repeats: int
    deadline_s: float  # the run stops here, keeping the rounds it finished


@dataclass(frozen=True)
class Placement:
    name: str
    target: str  # a PriceRun label: the target's verify prices
    draft: str  # a PriceRun label: the draft's token (its b=1)


@dataclass(frozen=True)
class Plan:
    shapes: tuple[str, ...]  # GGUFs to generate
    serve_shape: str
    ngl: int
    lead_cpus: str
    back_cpus: str
    max_tokens: int  # the serve check's reply
    draft_len: int  # lead's --draft-len in the serve check (0: lead chooses, as users run it)
    sim_tokens: int  # tokens per prompt in bench --sim
    prices: tuple[PriceRun, ...]
    placements: tuple[Placement, ...]


TARGET_SIZES = "1-17,24,32,48,64"

CUDA = Plan(
    shapes=("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "qwen2.5-32b"),
    serve_shape="qwen2.5-coder-1.5b", ngl=-1, lead_cpus="0-1", back_cpus="2-15",
    max_tokens=4096, draft_len=0, sim_tokens=64,
    prices=(  # the most wanted first: a run the budget cuts short keeps what it measured
        PriceRun("1.5B, GPU", "qwen2.5-coder-1.5b", -1, "0-1", TARGET_SIZES, 5, 20),
        PriceRun("0.5B draft, 14 CPU cores", "qwen2.5-coder-0.5b", 0, "2-15", "1-4", 5, 10),
        PriceRun("32B, GPU", "qwen2.5-32b", -1, "0-1", TARGET_SIZES, 3, 30),
        PriceRun("0.5B draft, GPU", "qwen2.5-coder-0.5b", -1, "0-1", "1-4", 10, 8),
        # a GPU too small for it: half the layers there, the rest on 12 cores
        PriceRun("32B, 32 of 64 layers on the GPU, 12 CPU cores", "qwen2.5-32b", 32, "0-11",
                 "1-9,12,16,17,32,64", 2, 40),
        PriceRun("0.5B draft, 4 CPU cores", "qwen2.5-coder-0.5b", 0, "12-15", "1-2", 3, 8),
    ),
    placements=(
        Placement("1.5B on the GPU, draft on 14 CPU cores", "1.5B, GPU",
                  "0.5B draft, 14 CPU cores"),
        Placement("32B on the GPU, draft on 14 CPU cores", "32B, GPU",
                  "0.5B draft, 14 CPU cores"),
        Placement("32B half on the GPU (12 cores), draft on the GPU",
                  "32B, 32 of 64 layers on the GPU, 12 CPU cores", "0.5B draft, GPU"),
        Placement("32B half on the GPU (12 cores), draft on 4 CPU cores",
                  "32B, 32 of 64 layers on the GPU, 12 CPU cores", "0.5B draft, 4 CPU cores"),
    ),
)

CPU = Plan(
    shapes=("tiny-target", "tiny-draft", "tiny-large"),
    serve_shape="tiny-target", ngl=0, lead_cpus="0", back_cpus="1", max_tokens=1536,
    draft_len=3,  # on one core nothing pays: lead would ask for no drafts at all
    sim_tokens=24,
    prices=(
        PriceRun("tiny target, CPU 0", "tiny-target", 0, "0", "1-9,16,32", 3, 20),
        PriceRun("tiny draft, CPU 1", "tiny-draft", 0, "1", "1-2", 3, 10),
        PriceRun("tiny large target, CPU 0", "tiny-large", 0, "0", "1-9,16", 2, 20),
    ),
    placements=(
        Placement("tiny target on CPU 0, draft on CPU 1", "tiny target, CPU 0",
                  "tiny draft, CPU 1"),
        Placement("tiny large target on CPU 0, draft on CPU 1", "tiny large target, CPU 0",
                  "tiny draft, CPU 1"),
    ),
)

PLANS = {"cuda": CUDA, "cpu": CPU}

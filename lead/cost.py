"""Cost-aware draft length, measured online.

cost(b): seconds to evaluate a batch of b tokens (EWMA per b).
alpha:   probability that a draft token is accepted, given its predecessors were
         (EWMA of the geometric estimate accepted / (accepted + rejections)).
A step verifying k draft tokens yields on average (1 - alpha^(k+1)) / (1 - alpha)
tokens and costs cost(k+1); pick k maximising tokens per second (k = 0: plain decode).

Batch sizes are explored one at a time: k never exceeds the largest batch size
measured so far, so a step is at most one size past what has been priced (an
unmeasured size is assumed to cost what the largest measured one does). A first
exploration with k = 8 cost ~6x a token on a CPU, and a few such misses slowed
lead by 10 %. While k = 0 wins, a probe of k = 1 every `probe_every` steps keeps
the estimates fresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

EWMA = 0.2


@dataclass
class CostModel:
    max_draft: int
    fixed: int | None = None  # a user-forced draft length bypasses the model
    alpha: float = 0.8  # prior: typical same-family drafts accept 0.8-0.9
    probe_every: int = 32
    cost_s: dict[int, float] = field(default_factory=dict)
    steps_since_draft: int = 0

    def record_step(self, batch_size: int, seconds: float) -> None:
        old = self.cost_s.get(batch_size)
        self.cost_s[batch_size] = seconds if old is None else old + EWMA * (seconds - old)
        self.steps_since_draft = 0 if batch_size > 1 else self.steps_since_draft + 1

    def record_verify(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        rejected = 1 if accepted < drafted else 0
        estimate = accepted / (accepted + rejected) if accepted + rejected else self.alpha
        self.alpha += EWMA * (estimate - self.alpha)

    def cost(self, batch_size: int) -> float:
        if batch_size in self.cost_s:
            return self.cost_s[batch_size]
        known = [b for b in self.cost_s if b < batch_size]
        return self.cost_s[max(known)] if known else 1.0

    def expected_tokens(self, k: int) -> float:
        a = min(self.alpha, 0.999)
        return (1.0 - a ** (k + 1)) / (1.0 - a)

    def rate(self, k: int) -> float:
        return self.expected_tokens(k) / max(self.cost(k + 1), 1e-9)

    def choose(self, available: int | None = None) -> int:
        """Best draft length <= available (None: what lead should ask backs for)."""
        upper = self.max_draft if available is None else min(available, self.max_draft)
        if self.fixed is not None:
            return min(self.fixed, upper)
        upper = min(upper, max(self.cost_s, default=1))  # at most one size past the priced
        best = max(range(upper + 1), key=self.rate)
        if best == 0 and upper > 0 and self.steps_since_draft >= self.probe_every:
            return 1
        return best

    def snapshot(self) -> dict[str, float]:
        out = {f"cost_b{b}": s for b, s in sorted(self.cost_s.items())}
        out["alpha"] = self.alpha
        return out

"""Pure verification of a draft against the target's logits.

Rows: `target_logits[i]` is the target's next-token logits after the context
extended by draft[:i]; so there is one row per draft token plus one (bonus).

- greedy: accept while draft[i] == argmax(row i); then emit argmax of the first
  disagreeing row (or of the last row: the bonus token).
- sampling, no draft probabilities: sample x_i ~ p_i; accept while x_i == draft[i];
  the first differing sample is emitted. Exact: each token is a draw from p.
- sampling with draft probabilities q_i (Leviathan et al. 2023, Chen et al. 2023):
  accept draft[i] with probability min(1, p_i(x)/q_i(x)); on rejection draw from
  norm(max(0, p_i - q_i)) and stop; if all pass, draw the bonus from p_k.

Penalties, logit bias and DRY (shared/penalties.py) adjust each row first, with the
history that row follows: the context and draft[:i]. What decoding alone carries from
token to token goes along the draft the same way (_Walk): mirostat's mu after draft[:i],
and the draws in their order (XTC's uniform, then the token's), so that drafts never
change what the samplers emit. A grammar (shared/grammar/constraint.py) then masks
row i with its state after draft[:i], so a draft token it refuses has p = 0 and is never
accepted. p is that adjusted, masked distribution, so each emitted token is what
decoding without drafts would have drawn. Logprobs are read from the rows before the mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shared.grammar.constraint import Constraint, best, masked
from shared.penalties import adjust_rows
from shared.sampling import (
    Dist,
    distribution,
    drops_best,
    is_greedy,
    mirostat_mu,
    sample,
    xtc_draws,
)
from shared.wire.protocol import SamplingParams


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # the draft's accepted prefix
    next_token: int  # bonus (all accepted) or the target's correction
    # the rows verified, penalised: row i emitted emitted[i] (logprobs are read from them)
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)
    # the grammar's state after the emitted tokens (None: no grammar)
    constraint: Constraint | None = field(default=None, compare=False, repr=False)
    mu: float | None = None  # mirostat's state after the emitted tokens (None: off)
    # the distribution each emitted token was drawn from, where one was (greedy: none)
    dists: list[Dist] = field(default_factory=list, compare=False, repr=False)

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted, self.next_token]


def verify(draft_token_ids: Sequence[int], target_logits: np.ndarray, params: SamplingParams,
           rng: np.random.Generator, draft_dists: Sequence[Dist] | None = None,
           context: Sequence[int] = (), n_prompt: int = 0,
           constraint: Constraint | None = None, mu: float | None = None) -> Verdict:
    """`context`: the tokens row 0 follows (the first `n_prompt` of them the prompt), for
    the penalties and DRY; `constraint`: the grammar's state after `context`, or None;
    `mu`: mirostat's state after `context` (None: its start)."""
    assert target_logits.shape[0] == len(draft_token_ids) + 1, "one row per draft token + 1"
    rows = adjust_rows(target_logits, params, context, n_prompt, draft_token_ids)
    walk = _Walk(constraint, params, rng, mu)
    if is_greedy(params):
        verdict = _verify_drawn(draft_token_ids, rows, walk, walk.best)
    elif draft_dists is None:
        verdict = _verify_drawn(draft_token_ids, rows, walk, lambda row: sample(walk.p(row), rng))
    else:
        verdict = _verify_rejection(draft_token_ids, draft_dists, rows, rng, walk)
    walk.take(verdict.next_token)
    return Verdict(verdict.accepted, verdict.next_token, rows, walk.state, mu=walk.mu,
                   dists=walk.dists)


class _Walk:
    """The state along the draft, as decoding alone holds it at each position: the
    grammar's (row i is masked by its state after draft[:i]), mirostat's mu (after
    draft[:i]), and the draws: XTC's uniform, then the token's, from the one generator."""

    def __init__(self, state: Constraint | None, params: SamplingParams,
                 rng: np.random.Generator, mu: float | None) -> None:
        self.state, self.params, self.rng = state, params, rng
        self.mu = (2.0 * params.mirostat_tau if mu is None else mu) if params.mirostat \
            else None
        self.dists: list[Dist] = []  # p at each position so far

    def p(self, row: np.ndarray) -> Dist:
        coin = self.rng.random() if xtc_draws(self.params) else None
        self.dists.append(row_dist(row, self.state, self.params, coin, self.mu))
        return self.dists[-1]

    def best(self, row: np.ndarray) -> int:
        """Greedy's token: the best the samplers leave (most often the row's best)."""
        if not drops_best(self.params):
            return best(row, self.state)
        return int(self.p(row).token_ids[0])

    def take(self, token: int) -> None:
        if self.state is not None:
            self.state = self.state.advanced([token])
        if self.mu is not None and not is_greedy(self.params):
            self.mu = mirostat_mu(self.mu, self.params, self.dists[-1].prob_of(token))


def row_dist(row: np.ndarray, state: Constraint | None, params: SamplingParams,
             coin: float | None = None, mu: float | None = None) -> Dist:
    """p: what a token is drawn from at a (penalised) row, the grammar in `state`; `coin`
    and `mu`: XTC's draw and mirostat's state there (Verdict.dists holds the p drawn)."""
    return distribution(masked(row, state), params, coin=coin, mu=mu)


def _verify_drawn(draft: Sequence[int], rows: np.ndarray, walk: _Walk,
                  draw: Callable[[np.ndarray], int]) -> Verdict:
    """Greedy (`draw`: the best token) or sampling without draft probabilities (a sample):
    accept while the token drawn from each row is the draft's."""
    for i, token in enumerate(draft):
        drawn = draw(rows[i])
        if drawn != token:
            return Verdict(list(draft[:i]), drawn)
        walk.take(token)
    return Verdict(list(draft), draw(rows[len(draft)]))


def _verify_rejection(draft: Sequence[int], dists: Sequence[Dist], rows: np.ndarray,
                      rng: np.random.Generator, walk: _Walk) -> Verdict:
    for i, token in enumerate(draft):
        p = walk.p(rows[i])
        p_x, q_x = p.prob_of(token), dists[i].prob_of(token)
        # q_x == 0 cannot come from an honest draw: treat as a rejection.
        if q_x > 0 and rng.random() * q_x < p_x:
            walk.take(token)
            continue
        return Verdict(list(draft[:i]), sample(residual(p, dists[i]), rng))
    return Verdict(list(draft), sample(walk.p(rows[len(draft)]), rng))


def residual(p: Dist, q: Dist) -> Dist:
    """norm(max(0, p - q)) on p's support; p itself when p <= q everywhere (p == q)."""
    excess = np.maximum(p.probs - _lookup(q, p.token_ids), 0.0)
    total = excess.sum()
    if not total > 1e-12:  # also NaN: never an empty or undefined distribution
        return p
    keep = excess > 0
    return Dist(p.token_ids[keep], excess[keep] / total)


def _lookup(q: Dist, ids: np.ndarray) -> np.ndarray:
    """q's probability of each of `ids` (0 off q's support)."""
    order = np.argsort(q.token_ids)
    sorted_ids = q.token_ids[order]
    pos = np.clip(np.searchsorted(sorted_ids, ids), 0, sorted_ids.size - 1)
    hit = sorted_ids[pos] == ids
    return np.where(hit, q.probs[order][pos], 0.0)

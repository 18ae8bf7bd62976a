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

A tree (`verify_tree`) is the draft and branches beside it: a branch at i holds a root
token in place of draft[i] and its continuation. Where the draft is rejected at i and the
token emitted there is a branch's root, verification goes on along that branch, with its
rows from the same batch: exactly what the next step would do with that branch as its
draft. The root is never accepted as a guess (it was chosen, not sampled): it is only
ever followed once lead has drawn it itself.

Penalties and logit bias (shared/penalties.py) adjust each row first, with the history
that row follows: the context and draft[:i]. A grammar (shared/constraint.py) then masks
row i with its state after draft[:i], so a draft token it refuses has p = 0 and is never
accepted. p is that adjusted, masked distribution, so each emitted token is what
decoding without drafts would have drawn. Logprobs are read from the rows before the mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from shared.branch import Branch
from shared.constraint import Constraint, best, masked
from shared.penalties import adjust_rows
from shared.protocol import SamplingParams
from shared.sampling import Dist, distribution, is_greedy, sample


@dataclass(frozen=True)
class Verdict:
    accepted: list[int]  # the draft's accepted prefix
    next_token: int  # bonus (all accepted) or the target's correction
    # the rows verified, penalised: row i emitted emitted[i] (logprobs are read from them)
    rows: np.ndarray | None = field(default=None, compare=False, repr=False)
    # the grammar's state after the emitted tokens (None: no grammar)
    constraint: Constraint | None = field(default=None, compare=False, repr=False)
    branch: int | None = None  # the tree's branch the verdict followed (None: the draft)

    @property
    def emitted(self) -> list[int]:
        return [*self.accepted, self.next_token]


def verify(draft_token_ids: Sequence[int], target_logits: np.ndarray, params: SamplingParams,
           rng: np.random.Generator, draft_dists: Sequence[Dist] | None = None,
           context: Sequence[int] = (), n_prompt: int = 0,
           constraint: Constraint | None = None) -> Verdict:
    """`context`: the tokens row 0 follows (the first `n_prompt` of them the prompt), for
    the penalties; `constraint`: the grammar's state after `context`, or None."""
    assert target_logits.shape[0] == len(draft_token_ids) + 1, "one row per draft token + 1"
    rows = adjust_rows(target_logits, params, context, n_prompt, draft_token_ids)
    walk = _Walk(constraint, params)
    if is_greedy(params):
        verdict = _verify_drawn(draft_token_ids, rows, walk, lambda row: best(row, walk.state))
    elif draft_dists is None:
        verdict = _verify_drawn(draft_token_ids, rows, walk, lambda row: sample(walk.p(row), rng))
    else:
        verdict = _verify_rejection(draft_token_ids, draft_dists, rows, rng, walk)
    walk.take(verdict.next_token)
    return Verdict(verdict.accepted, verdict.next_token, rows, walk.state)


def verify_tree(draft_token_ids: Sequence[int], target_logits: np.ndarray,
                branches: Sequence[tuple[Branch, np.ndarray]], params: SamplingParams,
                rng: np.random.Generator, draft_dists: Sequence[Dist] | None = None,
                context: Sequence[int] = (), n_prompt: int = 0,
                constraint: Constraint | None = None) -> Verdict:
    """verify() over the draft, then, where the token emitted in place of a rejected draft
    token is a branch's root there, over that branch; `accepted` is then the draft's
    accepted prefix, the root and the branch's accepted tokens. Each branch comes with its
    rows: rows[i] the target's logits after its token_ids[:i + 1]."""
    verdict = verify(draft_token_ids, target_logits, params, rng, draft_dists, context,
                     n_prompt, constraint)
    at, root = len(verdict.accepted), verdict.next_token
    taken = next((j for j, (b, _) in enumerate(branches) if at < len(draft_token_ids)
                  and b.at == at and b.token_ids[0] == root), None)
    if taken is None:
        return verdict
    b, rows = branches[taken]
    tail = verify(b.token_ids[1:], rows, params, rng, b.dists[1:] if b.dists else None,
                  [*context, *verdict.accepted, root], n_prompt, verdict.constraint)
    assert verdict.rows is not None and tail.rows is not None
    return Verdict([*verdict.accepted, root, *tail.accepted], tail.next_token,
                   np.concatenate([verdict.rows[:at + 1], tail.rows]), tail.constraint, taken)


class _Walk:
    """The grammar's state along the draft: row i is masked by the state after draft[:i]."""

    def __init__(self, state: Constraint | None, params: SamplingParams) -> None:
        self.state, self.params = state, params

    def p(self, row: np.ndarray) -> Dist:
        return distribution(masked(row, self.state), self.params)

    def take(self, token: int) -> None:
        if self.state is not None:
            self.state = self.state.advanced([token])


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

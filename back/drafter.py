"""Drafters: keep a local sequence (lead's tokens + own guesses) and extend it.

`catch_up(lead_tokens)` makes the local sequence agree with lead: a draft that lead
has overtaken correctly is kept, a wrong one is cut back to the common prefix, and
only what is missing is evaluated. `next_token` proposes one more token, drawn from
the draft's logits adjusted by the request's penalties and bias as lead adjusts the
target's (shared/penalties.py), then masked by the request's grammar in the state after
the reply's tokens so far, lead's and its own (shared/constraint.py), so that greedy
drafts follow lead's choices. A `ModelDrafter` over a model that forks also drafts
`branch`es off its draft: the runner-up where lead likely rejects a guess, then a draft
after it, on the model's second sequence (docs/back-loop.md, "Branches").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from back.ngram import ngram_draft
from shared.constraint import Constraint, Track, best, masked
from shared.model import (
    EvaluationAborted,
    Forking,
    Model,
    can_fork,
    common_prefix,
    sync_cache,
)
from shared.penalties import adjust
from shared.protocol import SamplingParams
from shared.sampling import Dist, distribution, is_greedy, sample

MAX_SUPPORT = 64  # a cap on the draft's sampling support keeps posted q small and exact
MAX_GRAMMARS = 8  # parsed grammars kept, by text
log = logging.getLogger("back")


class Drafter(Protocol):
    local: list[int]

    def catch_up(self, lead_tokens: Sequence[int]) -> int: ...

    def fits(self, n_tokens: int) -> bool:
        """Whether it can hold this many of lead's tokens and draft past them."""
        ...

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        """One more guess, or None: nothing to guess, or `abort` said stop midway.
        `n_prompt`: how many of lead's tokens are the prompt (the penalties need it)."""
        ...


@dataclass(frozen=True)
class Pick:
    """How a guess was picked: its distribution (None: greedy), the next likeliest token in
    the same adjusted, masked row (None: no other), and the guess's own probability."""

    token: int
    dist: Dist | None
    runner_up: int | None
    prob: float


@dataclass(frozen=True)
class Branch:
    """`tokens`: the runner-up at `pos` in place of the draft's guess, then guesses after
    it; `dists`: the distribution of each (the runner-up's: the row it was ranked in)."""

    pos: int
    main: tuple[int, ...]  # the drafter's sequence up to and including the guess at pos
    tokens: tuple[int, ...]
    dists: tuple[Dist | None, ...]
    params: SamplingParams
    ended: bool  # at an end of generation or of the context: no deeper branch to draft

    def fits(self, main: Sequence[int], depth: int, params: SamplingParams) -> bool:
        """Whether it still branches off `main` (up to the guess at pos), this deep."""
        return (len(self.tokens) > depth or self.ended) and params == self.params \
            and tuple(main) == self.main


def _runner_up(row: np.ndarray, state: Constraint | None, token: int) -> int | None:
    """The likeliest token after `token` that `state` allows, or None."""
    rest = row.copy()
    rest[token] = -np.inf
    other = best(rest, state)
    allowed = np.isfinite(rest[other]) and (state is None or state.allows(other))
    return other if other != token and allowed else None  # (a mask lets EOS through)


def _prob(row: np.ndarray, token: int) -> float:
    """`token`'s probability in softmax(row) (unmasked: only to rank guesses)."""
    shifted = np.exp(row.astype(np.float64) - float(np.max(row)))
    return float(shifted[token] / shifted.sum())


class ModelDrafter:
    """A draft model's guesses. A guess is handed out as soon as it is sampled and only
    evaluated (to get the logits for the next one) on the next call: the first guess after
    catching up is ready one draft step sooner, when lead most needs it, right after a
    rejection."""

    def __init__(self, model: Model, batch: int = 512,
                 progress: Callable[[int, int], None] | None = None, blind: bool = False
                 ) -> None:
        """`blind`: draft without the request's grammar (benchmarks compare the two)."""
        self.model, self.batch, self.progress, self.blind = model, batch, progress, blind
        self._logits: np.ndarray | None = None  # next-token logits after model.cached
        self._pending: list[int] = []  # a guess handed out, not yet evaluated
        self._grammars: dict[str, Constraint | None] = {}  # text -> start state (None: bad)
        self._track: Track | None = None  # the grammar's state along `local`
        self._track_key: tuple[str, int] | None = None  # (grammar, n_prompt) it follows
        self._picks: dict[int, Pick] = {}  # position in local -> how its guess was picked
        self._branches: dict[int, Branch] = {}  # position -> the branch drafted off it

    @property
    def local(self) -> list[int]:
        return self.model.cached + self._pending

    def fits(self, n_tokens: int) -> bool:
        return n_tokens < self.model.n_ctx

    def catch_up(self, lead_tokens: Sequence[int]) -> int:
        keep = common_prefix(self.local, lead_tokens)
        if keep == len(lead_tokens) and self._logits is not None and keep > 0:
            # lead is a prefix of our draft: nothing to redo; guesses lead holds are settled
            self._picks = {p: pick for p, pick in self._picks.items() if p >= keep}
            self._branches = {p: b for p, b in self._branches.items() if p >= keep}
            return 0
        self._pending, self._picks, self._branches = [], {}, {}
        if self.can_branch:  # its cells share the KV buffer: free them for lead's tokens
            cast(Forking, self.model).fork(0)
        # Re-evaluate at least the last token, whose logits we need to draft on.
        head = list(lead_tokens[:-1])
        evaluated = sync_cache(self.model, head, self.batch, self.progress)
        self._logits = self.model.evaluate([lead_tokens[-1]], 1)[-1]
        return evaluated + 1

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        if self._logits is None or len(self.local) >= self.model.n_ctx:
            return None
        if self._pending:
            self._make_room(len(self._pending))
            try:
                self._logits = self.model.evaluate(self._pending, 1, abort)[-1]
            except EvaluationAborted:
                return None  # the guess stays pending: local is unchanged
            self._pending = []
        pick = self._pick(self._logits, self.local, params, rng, n_prompt, self.can_branch)
        self._picks[len(self.local)] = pick
        self._pending = [pick.token]
        return pick.token, pick.dist

    def _pick(self, logits: np.ndarray, path: Sequence[int], params: SamplingParams,
              rng: np.random.Generator, n_prompt: int, ranked: bool = False) -> Pick:
        """The guess after `path`, from `logits` (the next-token row there); `ranked`: with
        its runner-up and probability, which cost a pass over the row (branch sites only:
        the main chain's guesses where the model can fork)."""
        # q is what the guess is drawn from: the adjusted, masked logits, as lead's p
        row = adjust(logits, params, path, n_prompt)
        state = self._grammar_state(params.grammar, n_prompt, path)
        if is_greedy(params):
            token = best(row, state)
            if not ranked:
                return Pick(token, None, None, 1.0)
            return Pick(token, None, _runner_up(row, state, token), _prob(row, token))
        dist = distribution(masked(row, state), params, MAX_SUPPORT)
        token = sample(dist, rng)
        others = [int(t) for t in dist.token_ids if t != token]  # by descending probability
        return Pick(token, dist, others[0] if others else None, dist.prob_of(token))

    # --- branches ---
    @property
    def can_branch(self) -> bool:
        return can_fork(self.model)

    def _branch_cells(self) -> int:
        """KV cells the branch holds beyond what it shares with the main sequence."""
        if not self.can_branch:
            return 0
        model = cast(Forking, self.model)
        return len(model.branch_cached) - common_prefix(model.branch_cached, model.cached)

    def _make_room(self, n: int) -> None:
        """Drop the branch where the main sequence needs its cells (one KV buffer)."""
        if self._branch_cells() and len(self.model.cached) + self._branch_cells() + n \
                > self.model.n_ctx:
            cast(Forking, self.model).fork(0)
            self._branches = {}

    def branch_sites(self, first: int, limit: int) -> list[int]:
        """Positions of the draft from `first` on (past lead's tokens), likeliest first to
        be where lead rejects the draft: reached (every guess before accepted) and not
        accepted there, by the draft's own probabilities. Only those with a runner-up."""
        local, reach, odds = self.local, 1.0, {}
        for pos in range(first, len(local)):
            pick = self._picks.get(pos)
            if pick is None or pick.token != local[pos]:
                break  # not this drafter's guess (lead's token, or redrafted)
            if pick.runner_up is not None:
                odds[pos] = reach * (1.0 - pick.prob)
            reach *= pick.prob
        return sorted(odds, key=lambda p: -odds[p])[:limit]

    def branch(self, pos: int, depth: int, params: SamplingParams, rng: np.random.Generator,
               stop: frozenset[int], abort: Callable[[], bool] | None = None,
               n_prompt: int = 0) -> Branch | None:
        """The runner-up at `pos` (a guess of the draft) and up to `depth` guesses after it,
        drafted on the model's second sequence: the main draft stays cached. Kept, so asked
        again it costs nothing; cut short where `abort` says stop (None if that leaves the
        root alone, or nothing to branch)."""
        pick = self._picks.get(pos)
        if pick is None or pick.runner_up is None:
            return None
        kept = self._branches.get(pos)
        if kept is not None and kept.fits(self.local[:pos + 1], depth, params):
            return kept
        path = self.local[:pos] + [pick.runner_up]
        model = cast(Forking, self.model)  # (can_branch said so)
        model.fork(pos)  # the prefix is in the cache: the pending guess is past `pos`
        tokens, dists = [pick.runner_up], [pick.dist]
        try:
            # its own cells and the main sequence's share the context
            while len(tokens) <= depth and tokens[-1] not in stop \
                    and len(self.model.cached) + len(tokens) < self.model.n_ctx:
                logits = model.evaluate_branch([path[-1]], 1, abort)[-1]
                guess = self._pick(logits, path, params, rng, n_prompt)
                tokens.append(guess.token)
                dists.append(guess.dist)
                path.append(guess.token)
        except EvaluationAborted:  # lead's news: a branch cut short is worth posting
            if len(tokens) < 2:  # the root alone: lead makes that token itself
                return None
        ended = tokens[-1] in stop or len(self.model.cached) + len(tokens) >= self.model.n_ctx
        made = Branch(pos, tuple(self.local[:pos + 1]), tuple(tokens), tuple(dists), params,
                      ended)
        self._branches[pos] = made
        return made

    def _grammar_state(self, grammar: str | None, n_prompt: int,
                       path: Sequence[int]) -> Constraint | None:
        """The grammar's state after `path` (None: no grammar, or drafting blind)."""
        if not grammar or self.blind:
            return None
        if self._track_key != (grammar, n_prompt):
            root = self._parsed(grammar)
            self._track = None if root is None else Track(root, n_prompt)
            self._track_key = (grammar, n_prompt)
        # None if lead's tokens leave the grammar (they cannot): then drafted blind
        return self._track.at(path) if self._track is not None else None

    def _parsed(self, grammar: str) -> Constraint | None:
        if grammar not in self._grammars:
            if len(self._grammars) >= MAX_GRAMMARS:
                self._grammars.clear()
            try:
                self._grammars[grammar] = self.model.constraint(grammar)
            except ValueError as exc:  # lead parsed it: another llama.cpp may not
                log.warning("the request's grammar does not parse here (%s); drafting "
                            "without it", exc)
                self._grammars[grammar] = None
        return self._grammars[grammar]


class NgramDrafter:
    def __init__(self, n_max: int = 4) -> None:
        self.n_max = n_max
        self.local: list[int] = []

    def fits(self, n_tokens: int) -> bool:
        return True

    def catch_up(self, lead_tokens: Sequence[int]) -> int:
        keep = common_prefix(self.local, lead_tokens)
        if keep < len(lead_tokens):
            self.local = list(lead_tokens)
        return len(lead_tokens) - keep

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None, n_prompt: int = 0
                   ) -> tuple[int, Dist | None] | None:
        guess = ngram_draft(self.local, self.n_max, 1)
        if not guess:
            return None
        self.local.append(guess[0])
        return guess[0], None  # no probabilities: lead verifies by sample-and-compare

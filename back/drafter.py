"""Drafters: keep a local sequence (lead's tokens + own guesses) and extend it.

`catch_up(lead_tokens)` makes the local sequence agree with lead: a draft that lead has
overtaken correctly is kept, a wrong one is cut back to the common prefix, and only what is
missing is evaluated. Each growth (`begin_growth`, a model call, `end_growth`) proposes one
more token from the draft's logits adjusted as lead adjusts the target's
(shared/penalties.py), then masked by the request's grammar after the reply's tokens so far
(back/track.py), so that greedy drafts follow lead's choices. A `ModelDrafter` over a model
that forks also grows branches off its draft (docs/back-loop.md, "Branches").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from back.branching import (
    Growing,
    Pick,
    Sprout,
    assign,
    branch_sites,
    rejection_probs,
    taken_by_lead,
)
from back.track import Grammars
from shared.grammar.constraint import Constraint, best, masked
from shared.model import MAIN, Forking, Model, can_fork, common_prefix, sync_cache
from shared.ngram import NgramIndex
from shared.penalties import adjust
from shared.sampling import distribution, is_greedy, sample
from shared.wire.protocol import SamplingParams

MAX_SUPPORT = 64  # a cap on the draft's sampling support keeps posted q small and exact
GRAMMAR_PICK_S = 1.0  # a grammar taking longer than this on one guess is dropped
log = logging.getLogger("back")


@dataclass(frozen=True)
class Grown:
    """What one growth did: the draft's next guess (None: it was not grown), branches that
    grew a token, how the guess was picked (None: not known: lead verifies it by
    sample-and-compare, without the drafter's q)."""

    guess: int | None
    branches_grown: int
    pick: Pick | None = None


class Drafter:
    """What the back's jobs (back/jobs.py) ask of every kind of drafter: hold lead's tokens
    (`catch_up`), grow the draft past them a guess per call (`begin_growth`: what the model
    call evaluates, per sequence, MAIN or a branch, empty for none, None: nothing to do;
    `end_growth`: the guesses from its rows), with branches where it `can_branch`. The
    defaults are a drafter's that needs no model: `free`, a guess costs no model call, so a
    job drafts as far ahead as it may at once."""

    local: list[int]
    free: bool = True
    can_branch: bool = False
    branches: tuple[Sprout, ...] = ()

    def fits(self, n_tokens: int) -> bool:
        """Whether it can hold this many of lead's tokens and draft past them."""
        return True

    def catch_up(self, lead_tokens: Sequence[int], defer: bool = False) -> int:
        raise NotImplementedError

    def begin_growth(self, params: SamplingParams, chain: bool = True, width: int = 0,
                     depth: int = 0) -> dict[int, list[int]] | None:
        return {} if chain else None  # no model call

    def evaluate(self, batch: dict[int, list[int]], abort: Callable[[], bool] | None = None
                 ) -> dict[int, np.ndarray]:
        return {}

    def end_growth(self, rows: dict[int, np.ndarray], params: SamplingParams,
                   rng: np.random.Generator, n_prompt: int = 0, chain: bool = True,
                   width: int = 0) -> Grown:
        raise NotImplementedError


def _runner_up(row: np.ndarray, state: Constraint | None, token: int) -> int | None:
    """The likeliest token after `token` that `state` allows, or None."""
    rest = row.copy()
    rest[token] = -np.inf
    other = best(rest, state)
    allowed = np.isfinite(rest[other]) and (state is None or state.allows(other))
    return other if other != token and allowed else None  # (a mask lets EOS through)


def _draw(row: np.ndarray, state: Constraint | None, params: SamplingParams,
          rng: np.random.Generator, ranked: bool) -> Pick:
    """The guess from `row` (adjusted) under `state`; `ranked`: with its runner-up."""
    if is_greedy(params):
        token = best(row, state)
        runner_up = _runner_up(row, state, token) if ranked else None
        return Pick(token, None, runner_up, _prob(row, token))  # q goes with the post
    dist = distribution(masked(row, state), params, MAX_SUPPORT)
    token = sample(dist, rng)
    others = [int(t) for t in dist.token_ids if t != token]  # by descending probability
    return Pick(token, dist, others[0] if others else None, dist.prob_of(token))


def _prob(row: np.ndarray, token: int) -> float:
    """`token`'s probability in softmax(row) (unmasked: to rank guesses and to tell lead
    how sure the draft was; float32: a pass over the row costs ~0.1 ms, not more)."""
    shifted = np.exp(row - np.max(row), dtype=np.float32)
    return float(shifted[token] / shifted.sum(dtype=np.float64))


class ModelDrafter(Drafter):
    """A draft model's guesses. A guess is handed out as soon as it is sampled and evaluated
    (for the next one's logits) on the next call: the first guess after catching up is ready
    a draft step sooner, right after a rejection. Over a model that forks, each growth also
    grows branches (back/branching.py) in the same call."""

    free = False  # a guess costs a model call

    def __init__(self, model: Model, batch: int = 512,
                 progress: Callable[[int, int], None] | None = None, blind: bool = False,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        """`blind`: draft without the request's grammar (benchmarks compare the two);
        `clock` times the grammar's work on a guess (tests give a virtual one)."""
        self.model, self.batch, self.progress, self.blind = model, batch, progress, blind
        self.clock = clock
        self._logits: np.ndarray | None = None  # next-token logits after model.cached
        self._pending: list[int] = []  # a guess handed out, not yet evaluated
        self.grammars = Grammars(model.constraint)
        self._picks: dict[int, Pick] = {}  # position in local -> how its guess was picked
        self._growing: dict[int, Growing] = {}  # slot -> the branch it holds
        self._n_lead = 0  # lead's tokens at the last catch-up: sites lie past them

    @property
    def local(self) -> list[int]:
        return self.model.cached + self._pending

    def fits(self, n_tokens: int) -> bool:
        return n_tokens < self.model.n_ctx

    def catch_up(self, lead_tokens: Sequence[int], defer: bool = False) -> int:
        """Hold lead's tokens; the tokens evaluated. `defer`: leave the last one for the
        next growth to evaluate (in a batch with other sessions' guesses)."""
        self._n_lead = len(lead_tokens)
        if self._growing and common_prefix(self.local, lead_tokens) < len(lead_tokens):
            self._adopt(lead_tokens)
        keep = common_prefix(self.local, lead_tokens)
        ready = self._logits is not None or (defer and self._pending == [lead_tokens[-1]])
        if keep == len(lead_tokens) and ready and keep > 0:
            # lead is a prefix of our draft: nothing to redo; guesses lead holds are settled
            self._picks = {p: pick for p, pick in self._picks.items() if p >= keep}
            self._drop([s for s, g in self._growing.items() if g.pos < keep])
            return 0
        self._pending, self._picks = [], {}
        self._drop(list(self._growing))
        # Re-evaluate at least the last token, whose logits we need to draft on.
        evaluated = sync_cache(self.model, list(lead_tokens[:-1]), self.batch, self.progress)
        if defer:
            self._logits, self._pending = None, [lead_tokens[-1]]
            return evaluated
        self._logits = self.model.evaluate([lead_tokens[-1]], 1)[-1]
        return evaluated + 1

    def _adopt(self, lead_tokens: Sequence[int]) -> None:
        """Where lead took one of the branches, make it the draft: its slot becomes the
        main sequence (nothing evaluated again), the rest of the tree is dropped."""
        slot = taken_by_lead(self._growing, self.local, lead_tokens)
        if slot is None:
            return
        taken = self._growing.pop(slot)
        cast(Forking, self.model).adopt(slot)  # the old main sequence now sits in `slot`
        self._drop([slot, *self._growing])
        self._pending, self._logits = [taken.tokens[-1]], taken.row
        first = taken.pos + 1  # the root is lead's token: its guesses follow it
        self._picks = {p: pick for p, pick in self._picks.items() if p < taken.pos}
        self._picks.update({first + i: pick for i, pick in enumerate(taken.picks)})

    def _drop(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._growing.pop(slot, None)
            cast(Forking, self.model).fork(slot, 0)  # its cells go back to the shared buffer

    def begin_growth(self, params: SamplingParams, chain: bool = True, width: int = 0,
                     depth: int = 0) -> dict[int, list[int]] | None:
        """The tokens the next model call evaluates: the pending guess of the draft (if
        `chain`) and of up to `width` branches at the likeliest sites, up to `depth` guesses
        after each root, per sequence (empty: no call needed); None: nothing to do."""
        if (self._logits is None and not self._pending) or len(self.local) >= self.model.n_ctx:
            return None
        self._open(width, params)
        batch = self._batch(chain, depth)
        if self._growing and self._cells() + sum(len(t) for t in batch.values()) > self.model.n_ctx:
            self._drop(list(self._growing))  # the main sequence needs their cells
            batch = self._batch(chain, depth)
        return batch if batch or (chain and not self._pending) else None

    def end_growth(self, rows: dict[int, np.ndarray], params: SamplingParams,
                   rng: np.random.Generator, n_prompt: int = 0, chain: bool = True,
                   width: int = 0) -> Grown:
        """The draft's next guess (if `chain`) and a token more on each branch, from the
        `rows` of the call that evaluated what `begin_growth` gave."""
        ranked = width > 0 and self.can_branch
        pick = self._grow_chain(rows, params, rng, n_prompt, ranked) if chain else None
        full = self._cells() + len(rows) >= self.model.n_ctx
        for slot in rows.keys() - {MAIN}:
            self._grow_branch(self._growing[slot], rows[slot], rng, n_prompt, full)
        return Grown(pick.token if pick else None, len(rows) - (MAIN in rows), pick)

    def evaluate(self, batch: dict[int, list[int]], abort: Callable[[], bool] | None = None
                 ) -> dict[int, np.ndarray]:
        if self.can_branch:
            return cast(Forking, self.model).evaluate_many(batch, abort)
        return {MAIN: self.model.evaluate(batch[MAIN], 1, abort)[-1]}

    def _batch(self, chain: bool, depth: int) -> dict[int, list[int]]:
        """Per sequence, the tokens this call evaluates: the pending guess of each."""
        batch = {MAIN: self._pending} if chain and self._pending else {}
        stop = self.model.eos_token_ids
        for slot, g in self._growing.items():
            if len(g.tokens) <= depth and not g.ended and g.tokens[-1] not in stop:
                batch[slot] = [g.tokens[-1]]
        return batch

    def _grow_chain(self, rows: dict[int, np.ndarray], params: SamplingParams,
                    rng: np.random.Generator, n_prompt: int, ranked: bool) -> Pick:
        if MAIN in rows:
            self._logits, self._pending = rows[MAIN], []
        assert self._logits is not None
        pick = self._pick(self._logits, self.local, params, rng, n_prompt, ranked)
        self._picks[len(self.local)] = pick
        self._pending = [pick.token]
        return pick

    def _grow_branch(self, g: Growing, row: np.ndarray, rng: np.random.Generator,
                     n_prompt: int, full: bool) -> None:
        """`full`: the context has no room for more (the branch ends here)."""
        g.add(self._pick(row, g.path, g.params, rng, n_prompt, ranked=True))
        g.row = row
        g.ended = full or g.tokens[-1] in self.model.eos_token_ids

    def _pick(self, logits: np.ndarray, path: Sequence[int], params: SamplingParams,
              rng: np.random.Generator, n_prompt: int, ranked: bool = False) -> Pick:
        """The guess after `path`, from `logits` (the next-token row there); `ranked`: with
        its runner-up and probability, which cost a pass over the row (while the back
        grows branches: each guess is a site a branch may start at)."""
        # q is what the guess is drawn from: the adjusted, masked logits, as lead's p
        row = adjust(logits, params, path, n_prompt)
        grammar = None if self.blind else params.grammar
        started = self.clock()
        state = self.grammars.state(grammar, n_prompt, path)
        pick = _draw(row, state, params, rng, ranked)
        if state is not None and grammar and self.clock() - started > GRAMMAR_PICK_S:
            self.grammars.give_up(grammar, self.clock() - started, GRAMMAR_PICK_S)
        return pick

    # --- branches ---
    @property
    def can_branch(self) -> bool:
        return can_fork(self.model) and cast(Forking, self.model).n_branches > 0

    @property
    def branches(self) -> tuple[Sprout, ...]:
        """The branches grown past their root, likeliest first."""
        p_reject = rejection_probs(self._picks, self.local, self._n_lead)
        grown = [g for g in self._growing.values() if len(g.tokens) > 1]
        return tuple(g.snapshot() for g in sorted(grown, key=lambda g: -p_reject.get(g.pos, 0.0)))

    def _open(self, width: int, params: SamplingParams) -> None:
        """Branch slots for the `width` likeliest sites (what sits elsewhere is dropped)."""
        if not self.can_branch or (width == 0 and not self._growing):
            return
        model = cast(Forking, self.model)
        sites = branch_sites(self._picks, self.local, self._n_lead, min(width, model.n_branches))
        dropped, opened = assign(sites, self._growing, model.n_branches)
        self._drop(dropped)
        for slot, pos in opened:
            pick = self._picks[pos]
            if pick.runner_up is None or pos > len(self.model.cached):
                continue
            model.fork(slot, pos)  # the prefix is cached: shared, not evaluated again
            self._growing[slot] = Growing(
                pos, tuple(self.local[:pos + 1]), [pick.runner_up], [pick.dist], params)

    def _cells(self) -> int:
        """KV cells held: the main sequence's, and beyond what they share with it, each
        branch's evaluated tokens (all but the pending last one)."""
        return len(self.model.cached) + sum(len(g.tokens) - 1 for g in self._growing.values())


class NgramDrafter(Drafter):
    """Prompt lookup, as lead's own drafts (shared/ngram.py): what followed the longest
    earlier match of lead's tokens' end, copied a guess at a time."""

    def __init__(self) -> None:
        self.index = NgramIndex()  # over lead's tokens only: a wrong guess re-indexes nothing
        self.local: list[int] = []

    def catch_up(self, lead_tokens: Sequence[int], defer: bool = False) -> int:
        keep = common_prefix(self.local, lead_tokens)
        self.index.sync(lead_tokens)
        if keep < len(lead_tokens):
            self.local = list(lead_tokens)
        return len(lead_tokens) - keep

    def end_growth(self, rows: dict[int, np.ndarray], params: SamplingParams,
                   rng: np.random.Generator, n_prompt: int = 0, chain: bool = True,
                   width: int = 0) -> Grown:
        ahead = len(self.local) - len(self.index.tokens)  # (only called with `chain`)
        match = self.index.lookup(ahead + 1)
        if match is None or len(match.token_ids) <= ahead:
            return Grown(None, 0)
        self.local.append(match.token_ids[ahead])
        return Grown(match.token_ids[ahead], 0)

"""The decode loop's model side: prefill, one verify step, and what its verdict does.

Every evaluation runs on the one model thread, which gets what it needs as arguments
(the grammar's state among them) and gives back a StepResult (with the grammar's next
state); the session itself stays on the event loop, which installs that state. The model's
own `cached` list is the truth about its KV cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import cast

import numpy as np

from lead.cost import CostModel
from lead.drafts import Branch, Draft
from lead.session import Session, StepResult
from lead.verify import TreeBranch, Verdict, verify_tree
from shared.constraint import Constraint
from shared.logprobs import TokenLogprob, token_logprob
from shared.model import Forking, Model, can_fork, sync_cache
from shared.modelthread import ModelThread
from shared.protocol import SamplingParams

log = logging.getLogger("lead")
CALIBRATE_MAX_BATCH = 17  # every size up to this one is priced
LONG_SIZES = (24, 32, 48, 65)  # past it, these (lead's own drafts run up to 64 tokens)
# Trees are priced only where a token more costs under 5 % of a batch: a branch adds at
# most ~(1 - alpha) * cover * 3 tokens, about a tenth of a step's, and costs its tokens
# (a CPU core: 9 %; a GPU-like target: 1-2 %).
TREE_MARGINAL = 0.05
Clock = Callable[[], float]


class Decoder:
    def __init__(self, model: Model, cost: CostModel, thread: ModelThread, clock: Clock,
                 batch: int = 512, grammar_s: float = 1.0) -> None:
        """`grammar_s`: most seconds of verifying per token emitted that a constrained
        reply may take (an ambiguous grammar's masks can cost seconds a row)."""
        self.model, self.cost, self.thread, self.clock = model, cost, thread, clock
        self.batch, self.grammar_s = batch, grammar_s
        # branch sequences the target holds for trees (0: it verifies chains only)
        self.tree_slots = cast(Forking, model).n_branches if can_fork(model) else 0

    async def prefill(self, session: Session) -> None:
        session.prompt_evaluated = await self.thread.run(self._prefill, list(session.tokens))
        session.t_decode = self.clock()

    def _prefill(self, prompt_ids: list[int]) -> int:
        # The cache holds everything but the last token; each step evaluates that one.
        return sync_cache(self.model, prompt_ids[:-1], self.batch)

    def plan(self, session: Session, offered: Draft | None, max_tokens: int) -> Draft | None:
        """The offered draft cut to the length that pays and fits the context and the
        reply (a step emits its accepted tokens and one more), with the branches that pay
        beside it (a tree)."""
        if offered is None:
            return None
        room = min(self.model.n_ctx - len(session.tokens),  # KV room for draft tokens
                   max_tokens - session.n_generated - 1)
        first = session.n_generated == 0
        usable = self.cost.choose_odds(offered.odds[:room], first) if offered.odds else \
            self.cost.choose(min(len(offered.token_ids), room), first)
        if usable == 0:
            return None
        dists = offered.dists[:usable] if offered.dists else None
        roots = tuple((b.at, b.token_ids[0]) for b in offered.branches if b.at < usable)
        tree = self._tree(offered.branches, usable, room, self.model.n_ctx -
                          len(session.tokens) + 1, first)
        return Draft(offered.back_id, offered.token_ids[:usable], dists, offered.branch,
                     tree, roots)

    def _tree(self, offered: tuple[Branch, ...], k: int, room: int, most: int, first: bool
              ) -> tuple[Branch, ...]:
        """The offered branches that pay beside a draft of k, cut to the length that pays
        and reaches no further than `room`; `most` tokens in the batch."""
        if not offered or not self.tree_slots:
            return ()
        lengths = self.cost.branches(k, [(b.at, min(len(b.token_ids), room - b.at))
                                         for b in offered], most, first)
        return tuple(replace(b, token_ids=b.token_ids[:n], dists=b.dists[:n] if b.dists else None)
                     for b, n in zip(offered, lengths, strict=True) if n)[:self.tree_slots]

    async def step(self, session: Session, draft: Draft | None,
                   top_logprobs: int | None = None) -> StepResult:
        """Evaluate the session's last token and `draft` (and its branches) in the batch size
        the cost model prices best, and verify them; logprobs of what it emits if
        `top_logprobs` is not None."""
        size = self.cost.batch_for(draft.n_tokens + 1) if draft else 1
        size = min(size, self.model.n_ctx - len(session.tokens) + 1)
        return await self.thread.run(self._score, tuple(session.tokens), session.n_prompt,
                                     draft, session.params, session.rng, size, top_logprobs,
                                     session.constraint)

    def _score(self, tokens: tuple[int, ...], n_prompt: int, draft: Draft | None,
               params: SamplingParams, rng: np.random.Generator, size: int,
               top_logprobs: int | None, constraint: Constraint | None) -> StepResult:
        if len(self.model.cached) != len(tokens) - 1:  # e.g. after a cancelled request
            raise RuntimeError("model cache out of step with the session")
        draft_ids = draft.token_ids if draft else []
        tree = draft.branches if draft else ()
        n_rows = len(draft_ids) + 1
        t0 = self.clock()
        rows, branch_rows = self._evaluate(tokens[-1], draft, size)
        seconds = self.clock() - t0
        branches = [TreeBranch(b.at, b.token_ids, r, b.dists)
                    for b, r in zip(tree, branch_rows, strict=True)]
        verdict = verify_tree(draft_ids, rows[:n_rows], branches, params, rng,
                              draft.dists if draft else None, tokens, n_prompt, constraint)
        verify_s = self.clock() - t0 - seconds
        self._settle(len(tokens) + len(verdict.accepted), verdict.branch, len(tree))
        logprobs = None if top_logprobs is None else _logprobs(verdict, top_logprobs)
        taken = None if verdict.branch is None else tree[verdict.branch]
        root_at = None if taken is None else taken.at
        path = len(draft_ids) if taken is None else taken.at + len(taken.token_ids)
        return StepResult(verdict, 1 + (draft.n_tokens if draft else 0), seconds,
                          draft.back_id if draft else "", size, logprobs, path,
                          _covered(draft, verdict), len(tree), root_at, verify_s)

    def _evaluate(self, last: int, draft: Draft | None, size: int
                  ) -> tuple[np.ndarray, list[np.ndarray]]:
        """The rows after `last` and each draft token, and after each branch's tokens."""
        draft_ids = draft.token_ids if draft else []
        # padding's rows are not read, and _settle drops its cells
        main = [last, *draft_ids, *[last] * (size - 1 - (draft.n_tokens if draft else 0))]
        if draft is None or not draft.branches:
            return self.model.evaluate(main, len(main)), []
        forking = cast(Forking, self.model)
        return forking.evaluate_tree(main, [(b.at, b.token_ids) for b in draft.branches])

    def _settle(self, n_keep: int, taken: int | None, n_branches: int) -> None:
        """Keep the path verified: the branch taken (if one was) as the main sequence, up
        to `n_keep` tokens; every branch slot used is emptied."""
        if taken is not None:
            cast(Forking, self.model).adopt(taken)
        self.model.truncate(n_keep)
        for slot in range(n_branches):
            cast(Forking, self.model).fork(slot, 0)

    def apply(self, session: Session, result: StepResult, max_tokens: int, busy: bool
              ) -> list[int]:
        """Price the step, extend the session by what it emits, and count; the tokens
        emitted (cut at max_tokens and after an EOS)."""
        verdict = result.verdict
        drafted = result.batch - 1
        self.cost.record_step(result.evaluated, result.seconds, busy)
        if result.covered is not None:
            self.cost.record_cover(result.covered)
        emitted = verdict.emitted[: max_tokens - session.n_generated]
        eos = next((i for i, t in enumerate(emitted) if t in self.model.eos_token_ids), None)
        if eos is not None:
            emitted = emitted[: eos + 1]
            session.finish_reason = "stop"
        # none counted past an EOS
        accepted = sum(result.from_draft(i) for i in range(min(len(verdict.accepted),
                                                                len(emitted))))
        session.drafted += drafted
        session.rejections += result.rejections
        session.accepted += accepted
        if drafted:
            _add(session.accepted_by_back, result.back_id, accepted)
            _add(session.drafted_by_back, result.back_id, drafted)
        session.steps += 1
        session.tokens.extend(emitted)
        # The grammar's state after the whole verdict: a cut one ends the reply, so the
        # tokens it holds past the cut are never followed.
        session.constraint = verdict.constraint
        if session.finish_reason is None and (session.n_generated >= max_tokens
                                              or len(session.tokens) >= self.model.n_ctx
                                              or self._grammar_too_slow(session, result)):
            session.finish_reason = "length"
        return emitted

    def _grammar_too_slow(self, session: Session, result: StepResult) -> bool:
        """Whether a constrained reply's verifying took over `grammar_s` per token emitted:
        then it ends here (as llama.cpp's server ends one over its time limit), else it
        would hold lead for minutes."""
        per_token = result.verify_s / max(len(result.verdict.emitted), 1)
        if session.constraint is None or per_token <= self.grammar_s:
            return False
        log.warning("%s: its grammar took %.1f s a token to apply (over %.1f s): the reply "
                    "ends here", session.id, per_token, self.grammar_s)
        return True

    @staticmethod
    def cut(session: Session, n: int) -> None:
        """Drop the last `n` tokens of the step just applied (a stop string ended the reply
        before them), so that the reply and its usage are those of decoding without drafts.
        Their acceptance still counts: verification accepted them."""
        if n > 0:
            del session.tokens[-n:]

    def calibrate(self, max_draft: int, passes: int = 2, longest: int = 0) -> None:
        """Price verify batches of 1..max_draft+1 tokens (the fastest of `passes`) before
        serving, so lead need not explore batch sizes on live replies, and a few sizes up
        to `longest`+1 (lead's own drafts; sizes between are interpolated). Blocking."""
        self.thread.call(self._calibrate, max_draft, passes, longest)

    def _calibrate(self, max_draft: int, passes: int, longest: int) -> None:
        chain, tree = calibrated_sizes(max_draft, bool(self.tree_slots))
        long = [b for b in LONG_SIZES if chain[-1] < b <= min(longest + 1, self.model.n_ctx)]
        log.info("pricing verify batches of 1-%d tokens", (long or chain)[-1])
        self.model.evaluate([0], 1)  # the first evaluation allocates; it is not timed
        best = self._price(chain, passes)
        if tree and _marginal(best) < TREE_MARGINAL:
            log.info("a token more costs %.0f %% of a batch: pricing trees of up to %d tokens",
                     100 * _marginal(best), tree[-1])
            best |= self._price(tree, passes)
        self.cost.calibrate(best | self._price(long, passes))
        log.info("%s", self.cost.describe())

    def _price(self, sizes: list[int], passes: int) -> dict[int, float]:
        """The fastest of `passes` evaluations of each batch size, in seconds."""
        best: dict[int, float] = {}
        for _ in range(passes):
            for b in sizes:
                self.model.truncate(0)
                t0 = self.clock()
                self.model.evaluate([0] * b, b)
                best[b] = min(best.get(b, 1e9), self.clock() - t0)
        self.model.truncate(0)
        return best


def calibrated_sizes(max_draft: int, trees: bool) -> tuple[list[int], list[int]]:
    """Batch sizes to price: every one a chain may take; and, for trees, those past them
    up to a draft's worth more."""
    chain = min(max_draft + 1, CALIBRATE_MAX_BATCH)
    top = min(chain + max_draft, CALIBRATE_MAX_BATCH) if trees else chain
    return list(range(1, chain + 1)), list(range(chain + 1, top + 1))


def _marginal(seconds: dict[int, float]) -> float:
    """What a token more adds to the largest priced batch, over that batch's price, on
    average over the sizes priced (one step is noise: CPU kernels make some sizes cheap)."""
    top = max(seconds)
    if top < 2:
        return 1.0
    return (seconds[top] - seconds[1]) / (top - 1) / seconds[top]


def _logprobs(verdict: Verdict, n_top: int) -> list[TokenLogprob]:
    assert verdict.rows is not None, "verify keeps the rows it verified"
    return [token_logprob(verdict.rows[i], t, n_top) for i, t in enumerate(verdict.emitted)]


def _covered(draft: Draft | None, verdict: Verdict) -> bool | None:
    """Whether the token emitted in place of a rejected draft token was the root of a branch
    offered there; None where no draft token was rejected or none was offered there."""
    if draft is None:
        return None
    at = len(verdict.accepted) if verdict.branch is None else \
        draft.branches[verdict.branch].at
    roots = {root for where, root in draft.roots if where == at}
    if at >= len(draft.token_ids) or not roots:
        return None
    return verdict.emitted[at] in roots


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n

"""The decode loop's model side: prefill, one verify step, and what its verdict does.

Every evaluation runs on the one model thread, which gets what it needs as arguments
(the grammar's state among them) and gives back a StepResult (with the grammar's next
state); the session itself stays on the event loop, which installs that state. The model's
own `cached` list is the truth about its KV cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from lead.cost import CostModel
from lead.drafts import Draft
from lead.session import Session, StepResult
from lead.verify import Verdict, verify
from shared.constraint import Constraint
from shared.logprobs import TokenLogprob, token_logprob
from shared.model import Model, sync_cache
from shared.modelthread import ModelThread
from shared.protocol import SamplingParams

log = logging.getLogger("lead")
CALIBRATE_MAX_BATCH = 17  # larger sizes are priced like the largest calibrated one
Clock = Callable[[], float]


class Decoder:
    def __init__(self, model: Model, cost: CostModel, thread: ModelThread, clock: Clock,
                 batch: int = 512) -> None:
        self.model, self.cost, self.thread, self.clock = model, cost, thread, clock
        self.batch = batch

    async def prefill(self, session: Session) -> None:
        session.prompt_evaluated = await self.thread.run(self._prefill, list(session.tokens))
        session.t_decode = self.clock()

    def _prefill(self, prompt_ids: list[int]) -> int:
        # The cache holds everything but the last token; each step evaluates that one.
        return sync_cache(self.model, prompt_ids[:-1], self.batch)

    def plan(self, session: Session, offered: Draft | None, max_tokens: int) -> Draft | None:
        """The offered draft cut to the length that pays and fits the context and the
        reply (a step emits its accepted tokens and one more)."""
        if offered is None:
            return None
        room = min(self.model.n_ctx - len(session.tokens),  # KV room for draft tokens
                   max_tokens - session.n_generated - 1)
        usable = self.cost.choose(min(len(offered.token_ids), room), session.n_generated == 0)
        if usable == 0:
            return None
        dists = offered.dists[:usable] if offered.dists else None
        return Draft(offered.back_id, offered.token_ids[:usable], dists)

    async def step(self, session: Session, draft: Draft | None,
                   top_logprobs: int | None = None) -> StepResult:
        """Evaluate the session's last token and `draft` in the batch size the cost model
        prices best, and verify the draft; logprobs of what it emits if `top_logprobs`
        is not None."""
        size = self.cost.batch_for(len(draft.token_ids) + 1) if draft else 1
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
        n_rows = len(draft_ids) + 1
        padding = [tokens[-1]] * (size - n_rows)  # their rows are not read; truncate drops them
        t0 = self.clock()
        rows = self.model.evaluate([tokens[-1], *draft_ids, *padding], size)[:n_rows]
        seconds = self.clock() - t0
        verdict = verify(draft_ids, rows, params, rng, draft.dists if draft else None,
                         tokens, n_prompt, constraint)
        self.model.truncate(len(tokens) + len(verdict.accepted))
        logprobs = None if top_logprobs is None else _logprobs(verdict, top_logprobs)
        return StepResult(verdict, n_rows, seconds, draft.back_id if draft else "", size,
                          logprobs)

    def apply(self, session: Session, result: StepResult, max_tokens: int, busy: bool
              ) -> list[int]:
        """Price the step, extend the session by what it emits, and count; the tokens
        emitted (cut at max_tokens and after an EOS)."""
        verdict = result.verdict
        drafted = result.batch - 1
        self.cost.record_step(result.evaluated, result.seconds, busy)
        emitted = verdict.emitted[: max_tokens - session.n_generated]
        eos = next((i for i, t in enumerate(emitted) if t in self.model.eos_token_ids), None)
        if eos is not None:
            emitted = emitted[: eos + 1]
            session.finish_reason = "stop"
        accepted = min(len(verdict.accepted), len(emitted))  # none counted past an EOS
        session.drafted += drafted
        session.rejections += int(len(verdict.accepted) < drafted)
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
                                              or len(session.tokens) >= self.model.n_ctx):
            session.finish_reason = "length"
        return emitted

    @staticmethod
    def cut(session: Session, n: int) -> None:
        """Drop the last `n` tokens of the step just applied (a stop string ended the reply
        before them), so that the reply and its usage are those of decoding without drafts.
        Their acceptance still counts: verification accepted them."""
        if n > 0:
            del session.tokens[-n:]

    def calibrate(self, max_draft: int, passes: int = 2) -> None:
        """Price verify batches of 1..max_draft+1 tokens (the fastest of `passes`) before
        serving, so lead need not explore batch sizes on live replies. Blocking."""
        self.thread.call(self._calibrate, max_draft, passes)

    def _calibrate(self, max_draft: int, passes: int) -> None:
        sizes = range(1, min(max_draft + 1, CALIBRATE_MAX_BATCH) + 1)
        log.info("pricing verify batches of 1-%d tokens", sizes[-1])
        best: dict[int, float] = {}
        self.model.evaluate([0], 1)  # the first evaluation allocates; it is not timed
        for _ in range(passes):
            for b in sizes:
                self.model.truncate(0)
                t0 = self.clock()
                self.model.evaluate([0] * b, b)
                best[b] = min(best.get(b, 1e9), self.clock() - t0)
        self.model.truncate(0)
        self.cost.calibrate(best)
        log.info("%s", self.cost.describe())


def _logprobs(verdict: Verdict, n_top: int) -> list[TokenLogprob]:
    assert verdict.rows is not None, "verify keeps the rows it verified"
    return [token_logprob(verdict.rows[i], t, n_top) for i, t in enumerate(verdict.emitted)]


def _add(counts: dict[str, int], key: str, n: int) -> None:
    counts[key] = counts.get(key, 0) + n

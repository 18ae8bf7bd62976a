"""One generation as the engine's loop holds it: its request and session, its slot, what is
left of its prompt to evaluate, its draft board, what a step's verdict does to it (`apply`:
tokens, stop strings, finish, counts) and the emissions waiting for its reader; what its
slot shows (the metrics and the web page's live panel). Event loop only.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from lead.decode.session import Emission, GenRequest, Progress, Session, StepResult, merged
from lead.decode.textstream import TextStream
from lead.drafts.board import DraftBoard
from lead.drafts.own import OWN
from shared.model import Model

log = logging.getLogger("lead")


@dataclass
class Run:
    req: GenRequest
    session: Session
    board: DraftBoard = field(default_factory=DraftBoard)  # the drafts its session is offered
    text: TextStream = field(init=False)
    slot: int | None = None  # None: waiting for one
    todo: list[int] = field(default_factory=list)  # prompt tokens its slot still lacks
    after_rejection: bool = False  # the step before rejected a draft token
    _out: asyncio.Queue[Emission | BaseException] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        self.text = self.req.text() if self.req.text is not None else TextStream(self.req.stop)

    @property
    def decoding(self) -> bool:
        """Seated with its whole prompt cached: its steps verify."""
        return self.slot is not None and not self.todo

    def prefilled(self, n: int, now: float) -> None:
        """`n` more of its prompt's tokens are cached (0: seated, those found cached)."""
        del self.todo[:n]
        self.session.prompt_evaluated += n
        if not self.todo:
            self.session.t_decode = now
        # its last chunk is told with its last token, evaluated by its first step (`apply`):
        # one batch in llama-server's count, which evaluates them together
        if n == 0 or self.todo:
            self._progress(self.session.n_prompt - 1 - len(self.todo), now)

    def _progress(self, processed: int, now: float) -> None:
        """Where the request asked: how far its prompt's evaluation is, told as it goes."""
        s = self.session
        if not self.req.progress or s.n_generated:
            return
        cache = s.n_prompt - 1 - len(self.todo) - s.prompt_evaluated
        progress = Progress(s.n_prompt, cache, processed, int((now - s.t_start) * 1000))
        self._out.put_nowait(Emission("", 0, 0, progress=progress))

    def apply(self, result: StepResult, vocab: Model, grammar_s: float, now: float = 0.0
              ) -> None:
        """What a verify step's verdict does: the session extended by the tokens it emits
        (cut at max_tokens, an EOS, a stop string), counted, finished where it ends, and its
        emissions to the reader (the last one carrying the session, if it finished)."""
        s = self.session
        self._progress(s.n_prompt, now)  # its first step evaluated the prompt's last token
        emitted = _emitted(s, result, self.req.max_tokens, vocab.eos_token_ids)
        _count(s, result, len(emitted))
        s.tokens.extend(emitted)
        # The grammar's state after the whole verdict: a cut one ends the reply, so the
        # tokens it holds past the cut are never followed.
        s.constraint, s.mu = result.verdict.constraint, result.verdict.mu
        chunks = self._texts(emitted, vocab)
        if self.text.stopped:  # tokens past a stop string are no part of the reply (their
            del s.tokens[len(s.tokens) - len(emitted) + len(chunks):]  # acceptance counts)
            s.finish_reason, s.stop_sequence = "stop", self.text.matched
        if s.finish_reason is None and (s.n_generated >= self.req.max_tokens
                                        or len(s.tokens) >= vocab.n_ctx
                                        or _grammar_too_slow(s, result, grammar_s)):
            s.finish_reason = "length"
        for emission in merged([_emission(result, i, emitted[i], chunk, vocab)
                                for i, chunk in enumerate(chunks)]):
            self._out.put_nowait(emission)
        if s.finish_reason is not None:
            self._out.put_nowait(Emission(self.text.finish(), 0, 0, session=s))

    def _texts(self, emitted: list[int], vocab: Model) -> list[str]:
        """The text each token releases, up to the one that completes a stop string."""
        chunks: list[str] = []
        for token in emitted:
            eos = token in vocab.eos_token_ids
            chunks.append("" if eos else self.text.push(vocab.token_bytes(token)))
            if self.text.stopped:
                break
        return chunks

    def fail(self, error: BaseException) -> None:
        """End the reply with `error`, raised to its reader."""
        self._out.put_nowait(error)

    async def emissions(self) -> AsyncIterator[Emission]:
        """What the loop decides for this run, in order, up to its last emission (the one
        carrying the session), or the error that ended it."""
        while True:
            item = await self._out.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.session is not None:
                return


def slot_view(slot: int, run: Run | None) -> dict[str, object]:
    """What slot `slot` holds: idle, or `run` (a prompt being evaluated or a reply decoding)
    with its counts and the backs whose drafts are on its board."""
    if run is None:
        return {"slot": slot, "state": "idle"}
    s = run.session
    backs = sorted({c.back_id for kept in run.board.candidates.values() for c in kept} - {OWN})
    return {"slot": slot, "state": "prompt" if run.todo else "decoding",
            "prompt_left": len(run.todo), "tokens": s.n_generated, "drafted": s.drafted,
            "accepted": s.accepted, "own_accepted": s.accepted_by_back.get(OWN, 0),
            "backs": backs}


def _emitted(s: Session, result: StepResult, max_tokens: int, eos_ids: frozenset[int]
             ) -> list[int]:
    """The verdict's tokens the session takes: up to max_tokens and an EOS (which ends it)."""
    emitted = result.verdict.emitted[: max_tokens - s.n_generated]
    eos = next((i for i, t in enumerate(emitted) if t in eos_ids), None)
    if eos is None:
        return emitted
    s.finish_reason = "stop"
    return emitted[: eos + 1]


def _count(s: Session, result: StepResult, n_emitted: int) -> None:
    """The step's draft tokens verified and accepted (none counted past what it emits)."""
    drafted = result.batch - 1
    accepted = sum(result.from_draft(i) for i in range(n_emitted))
    s.drafted += drafted
    s.rejections += int(result.rejected)
    s.accepted += accepted
    if drafted:
        s.accepted_by_back[result.back_id] = s.accepted_by_back.get(result.back_id, 0) + accepted
        s.drafted_by_back[result.back_id] = s.drafted_by_back.get(result.back_id, 0) + drafted
    s.steps += 1


def _grammar_too_slow(s: Session, result: StepResult, grammar_s: float) -> bool:
    """Whether a constrained reply's verifying took over `grammar_s` per token emitted:
    then it ends here (as llama.cpp's server ends one over its time limit), else it would
    hold lead for minutes."""
    per_token = result.verify_s / max(len(result.verdict.emitted), 1)
    if s.constraint is None or per_token <= grammar_s:
        return False
    log.warning("%s: its grammar took %.1f s a token to apply (over %.1f s): the reply "
                "ends here", s.id, per_token, grammar_s)
    return True


def _emission(result: StepResult, i: int, token: int, chunk: str, vocab: Model) -> Emission:
    """The step's i-th token, `token`, releasing `chunk`."""
    drafted = result.from_draft(i)
    # An end-of-generation token has no logprob entry: its text is no part of the reply.
    logprobs = [] if result.logprobs is None or token in vocab.eos_token_ids else \
        [result.logprobs[i]]
    return Emission(chunk, 1, int(drafted), back=result.back_id if drafted else "",
                    logprobs=logprobs)

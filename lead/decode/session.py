"""What one generation holds: its request, its tokens and counts, and what a step yields."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lead.decode.textstream import TextStream
from lead.decode.verify import Verdict
from shared.grammar.constraint import Constraint
from shared.logprobs import TokenLogprob
from shared.wire.protocol import SamplingParams


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None  # None: no logprobs; n: each token's and the n likeliest
    # those logprobs read from the distribution sampled (after temperature and truncation:
    # llama-server's post_sampling_probs), not from the row before it
    post_sampling: bool = False
    constraint: Constraint | None = None  # the grammar (params.grammar) at the reply's start
    slot: int | None = None  # llama-server's id_slot: the slot it runs in (None, -1: any)
    # the reply's text as its tokens are decided (None: a TextStream of `stop`); an API's
    # own ends the reply by rules of its own too (/infill's: lead/apis/infill.py)
    text: Callable[[], TextStream] | None = None
    progress: bool = False  # llama-server's return_progress: an emission per prompt batch


@dataclass(frozen=True)
class Progress:
    """How far a prompt's evaluation is (llama-server's prompt_progress): its tokens, those
    found cached, those in the slot's cache now (found or evaluated), ms since it began."""
    total: int
    cache: int
    processed: int
    time_ms: int


@dataclass
class Emission:
    text: str
    n_tokens: int
    n_from_draft: int
    session: Session | None = None  # set on the last emission of a generation
    back: str = ""  # the back whose draft gave its accepted tokens
    logprobs: list[TokenLogprob] = field(default_factory=list)  # if asked, of its tokens
    choice: int = 0  # the request's choice it belongs to (OpenAI's n: lead/apis/choices.py)
    prompt: Session | None = None  # set on a generation's first: its prompt is read by then
    progress: Progress | None = None  # an emission of no tokens: how far its prompt is


def merged(emissions: list[Emission]) -> list[Emission]:
    """A step's emissions, one a token, joined where neighbours came the same way (from
    the same back's draft, or not from a draft): one event for a verified draft's tokens
    and one for the target's own token, not one a token. Each event costs lead, and a
    streaming client, the same whatever it holds, and a step on edits emits 8 tokens."""
    out: list[Emission] = []
    for e in emissions:
        last = out[-1] if out else None
        if last is not None and last.session is None and e.session is None and \
                bool(last.n_from_draft) == bool(e.n_from_draft) and last.back == e.back:
            out[-1] = Emission(last.text + e.text, last.n_tokens + e.n_tokens,
                               last.n_from_draft + e.n_from_draft, back=e.back,
                               logprobs=[*last.logprobs, *e.logprobs])
        else:
            out.append(e)
    return out


@dataclass
class Session:
    id: str
    tokens: list[int]
    n_prompt: int
    params: SamplingParams
    rng: np.random.Generator
    constraint: Constraint | None = None  # the grammar's state after the tokens so far
    mu: float | None = None  # mirostat's state after the tokens so far (None: its start)
    finish_reason: str | None = None  # set as it ends (lead/decode/engine.py `_end`)
    stop_sequence: str | None = None  # the stop string that ended it, if one did
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0  # verify steps that rejected a draft token
    steps: int = 0
    accepted_by_back: dict[str, int] = field(default_factory=dict)
    drafted_by_back: dict[str, int] = field(default_factory=dict)  # draft tokens verified
    prompt_evaluated: int = 0
    t_start: float = field(default_factory=time.perf_counter)
    t_decode: float = 0.0

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def n_generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    @property
    def n_cached(self) -> int:
        """Prompt tokens found in the cache, not evaluated (the last is always evaluated:
        the first step feeds it)."""
        return max(self.n_prompt - self.prompt_evaluated - 1, 0)


@dataclass
class StepResult:
    verdict: Verdict
    batch: int
    seconds: float
    back_id: str
    logprobs: list[TokenLogprob] | None = None  # of verdict.emitted, if the request asks
    verify_s: float = 0.0  # seconds verifying took: penalties, sampling and the grammar

    @property
    def rejected(self) -> bool:
        """Whether the step ended rejecting a draft token."""
        return len(self.verdict.accepted) < self.batch - 1

    def from_draft(self, i: int) -> bool:
        """Whether emitted token i was a draft's guess lead accepted."""
        return i < len(self.verdict.accepted)

"""Wire models of the lead <-> back protocol (JSON over HTTP and a WebSocket).

GET  /duo/info                                          -> Info
GET  /duo/grammar?session=                               -> Grammar (once per session)
GET  /duo/link   (WebSocket)  back: Hello, Posted...     <- lead: Update, Refused...

`State` is one session's news as a back's mirror holds it (`SessionState.as_state`).

The whole protocol, with the meaning of each field: docs/protocol.md.
"""

from __future__ import annotations

import hashlib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

# Hard wire limit; lead applies its own, smaller `max_draft` on top.
MAX_DRAFT_WIRE = 64
MAX_SUPPORT_WIRE = 256
MAX_LOGIT_BIAS = 1024  # entries; each costs a little on every verified row
MAX_BRANCHES = 8  # per draft post
MAX_BRANCH_TOKENS = 2 * MAX_DRAFT_WIRE  # over all of a post's branches

# The ranges OpenAI (frequency/presence, logit_bias) and llama.cpp (repeat) accept.
OpenAIPenalty = Annotated[float, Field(ge=-2.0, le=2.0, allow_inf_nan=False)]
RepeatPenalty = Annotated[float, Field(ge=0.01, le=100.0, allow_inf_nan=False)]  # float32-safe
RepeatLastN = Annotated[int, Field(ge=-1, le=1 << 20)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)]
LogitBias = Annotated[dict[Annotated[int, Field(ge=0)], Bias],
                      Field(max_length=MAX_LOGIT_BIAS)]
# llama-server's samplers lead serves beyond those (shared/samplers.py, shared/dry.py)
Share = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
Count = Annotated[int, Field(ge=0, le=1 << 20)]
Strength = Annotated[float, Field(ge=0.0, le=100.0, allow_inf_nan=False)]
DryLastN = Annotated[int, Field(ge=-1, le=1 << 20)]
DRY_BREAKERS = ("\n", ":", "\"", "*")  # llama-server's default sequence breakers
DryBreakers = Annotated[list[str], Field(min_length=1, max_length=64)]  # ("": skipped)


def _off(default: Any, description: str, **limits: Any) -> Any:
    """A field left off the wire at its default."""
    return Field(default, description=description, exclude_if=lambda v: v == default,
                 **limits)


class SamplingParams(BaseModel):
    """Sampling settings of a request; temperature 0 means greedy. The penalties and the
    bias change each row of logits before anything else (shared/penalties.py)."""

    model_config = ConfigDict(extra="forbid")
    temperature: float = Field(0.0, ge=0.0, le=100.0)
    top_k: int = Field(0, ge=0, description="0 = off")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    min_p: float = Field(0.0, ge=0.0, lt=1.0)
    seed: int | None = None
    frequency_penalty: OpenAIPenalty = Field(0.0, description="times each earlier occurrence "
                                             "in the reply, subtracted from a token's logit")
    presence_penalty: OpenAIPenalty = Field(0.0, description="subtracted from the logit of "
                                            "each token the reply already holds")
    repeat_penalty: RepeatPenalty = Field(1.0, description="llama.cpp's: logits of tokens in "
                                          "the last repeat_last_n of the context, prompt "
                                          "included, divided (if > 0) or multiplied by it")
    repeat_last_n: RepeatLastN = Field(64, description="repeat_penalty's window; -1 = the "
                                       "whole context, 0 = off")
    logit_bias: LogitBias = Field(default_factory=dict, description="token id -> added to "
                                  "its logit")
    # llama-server's other samplers (lead's order, llama-server's: shared/sampling.py), off
    # the wire at their defaults: a back that predates them follows every other request
    dry_multiplier: Strength = _off(0.0, "DRY's penalty on extending a repeat; 0 = off")
    dry_base: float = _off(1.75, "DRY's base", ge=1.0, le=100.0, allow_inf_nan=False)
    dry_allowed_length: Count = _off(2, "DRY: the longest repeat free of penalty")
    dry_penalty_last_n: DryLastN = _off(-1, "DRY's window; -1 = the whole context, 0 = off")
    dry_sequence_breakers: DryBreakers = _off(list(DRY_BREAKERS), "DRY: repeats end there")
    # the breakers as lead's vocabulary's tokens (shared/dry.py); None: none (a back's)
    dry_restarts: dict[int, tuple[tuple[int, ...], ...]] | None = Field(None, exclude=True,
                                                                        repr=False)
    typical_p: Share = _off(1.0, "locally typical sampling; 1 = off")
    min_keep: Count = _off(0, "the fewest tokens top-p, min-p, typical and XTC leave")
    xtc_probability: Share = _off(0.0, "XTC: the chance the likeliest tokens are excluded")
    xtc_threshold: Share = _off(0.1, "XTC: tokens this likely are excluded; > 0.5 = off")
    mirostat: Literal[0, 1, 2] = _off(0, "mirostat 1 or 2, in place of truncation; 0 = off")
    mirostat_tau: Strength = _off(5.0, "mirostat's target surprise (bits)")
    mirostat_eta: Share = _off(0.1, "mirostat's learning rate")
    # On the wire it is the state's `grammar`, beside `sampling`: a back that predates it
    # ignores it there, where in `sampling` (extra fields forbidden) it would refuse it.
    grammar: str | None = Field(None, exclude=True, description="GBNF the reply follows: "
                                "each row is masked after the penalties "
                                "(shared/grammar/constraint.py)")


LEAD_ID = Field("", description="this lead process's id: a new one means lead restarted")


class Info(BaseModel):
    model: str
    lead_id: str = LEAD_ID
    n_vocab: int
    fingerprint: str = Field(description="hash of the token table; equal => ids compatible")
    eos_token_ids: list[int]
    n_ctx: int
    max_draft: int = Field(description="most draft tokens lead verifies in one step")
    max_post: int = Field(description="most tokens lead takes in one draft post: a back "
                          "drafting further ahead than one step has a draft ready for the next")
    host: str = Field("", description="lead's host (its kernel's boot id): a back that sees "
                      "its own host here shares lead's CPUs")
    cpus: list[int] = Field(default_factory=list, description="the CPUs lead's threads run on")
    threads: int = Field(0, description="lead's compute threads")
    slots: int = Field(1, description="generations lead runs at once: a back on the link "
                       "may draft for as many")
    link: bool = Field(False, description="lead serves the link (GET /duo/link, a "
                       "WebSocket), which duo's back follows it by")


STEP_LEFT = ("seconds until the step lead is taking is due to end, as lead prices it, when "
             "this was sent (null: no step under way, or none priced yet): lead takes its next "
             "draft then, so a back posts before")


class Stop:
    """Why lead asks for no drafts of a session now: a state's `stop` (null: it asks for
    `draft_len` tokens, more than 0). The one signal that stops a back drafting."""

    SLOWED = "slowed"  # backs' work slows lead more than drafts could repay: do no work at
    # all for it, not even catching up (a probe asks again)
    UNPAID = "unpaid"  # drafts would not pay now: take in its tokens, draft nothing
    DONE = "done"  # the session ended


STOP = ("why lead asks for no drafts of this session now, or null: it asks for draft_len "
        "(> 0). slowed: its backs' work slows it more than drafts could repay, so a back does "
        "no work for it, not even catching up; unpaid: drafts would not pay now; done: the "
        "session ended. A back drafts for no other value")


def _stop_of(data: Any, done: bool = False) -> Any:
    """A state from a lead that predates `stop`: the reason read from `draft_len`, `done`
    (`done`: where it is not given) and its `hush`. (Lead sends no nulls, so a null `stop`
    is read this way too: `draft_len` above 0, as lead sets it exactly then.)"""
    if not isinstance(data, dict) or "stop" in data:
        return data
    stop = Stop.DONE if data.get("done", done) else Stop.SLOWED if data.get("hush") else \
        None if data.get("draft_len") else Stop.UNPAID
    return {**data, "stop": stop}


class State(BaseModel):
    version: int = Field(0, description="bumped on every change lead tells")
    lead_id: str = LEAD_ID
    session_id: str | None = None
    offset: int = 0
    token_ids: list[int] = Field(default_factory=list, description="tokens from offset on")
    n_tokens: int = 0
    n_prompt: int = 0
    done: bool = True
    draft_len: int = 0
    stop: str | None = Field(Stop.DONE, description=STOP)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    your_accepted: int = Field(0, description="the asking back's tokens accepted in this "
                                              "session so far")
    grammar_id: str | None = Field(None, description="names the session's grammar (a hash "
                                   "of its text), or null: a back fetches the text once, "
                                   "from GET /duo/grammar?session=ID")
    step_left_s: float | None = Field(None, ge=0, description=STEP_LEFT)

    # Lead sends null here (the text comes once, from /duo/grammar); a lead that predates
    # grammar_id sent the text in every state, and a back reads it from there.
    @computed_field(description="the GBNF grammar the reply follows (sampling.grammar), "
                    "or null")  # type: ignore[prop-decorator]
    @property
    def grammar(self) -> str | None:
        return self.sampling.grammar

    @model_validator(mode="before")
    @classmethod
    def _from_older_lead(cls, data: Any) -> Any:
        """A state from a lead that predates grammar_id (its grammar's text in every
        state), or `stop`."""
        if isinstance(data, dict) and data.get("grammar") is not None:
            sampling = data.get("sampling")
            sampling = sampling.model_dump() if isinstance(sampling, SamplingParams) else \
                dict(sampling or {})
            data = {**data, "sampling": {**sampling, "grammar": data["grammar"]}}
        return _stop_of(data, done=True)


def grammar_id(text: str) -> str:
    """A grammar's name on the wire: the first 16 hex digits of its text's SHA-256."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class Grammar(BaseModel):
    """A session's grammar, sent once per back and session (GET /duo/grammar)."""

    session_id: str
    grammar_id: str
    grammar: str = Field(description="the GBNF text; its grammar_id is its hash")


class DraftDist(BaseModel):
    """The exact (sparse) distribution a draft token was sampled from."""

    token_ids: list[int] = Field(max_length=MAX_SUPPORT_WIRE)
    probs: list[float] = Field(max_length=MAX_SUPPORT_WIRE)

    @model_validator(mode="after")
    def _same_length(self) -> DraftDist:
        if len(self.token_ids) != len(self.probs) or not self.token_ids:
            raise ValueError("token_ids and probs must be non-empty and of equal length")
        if len(set(self.token_ids)) != len(self.token_ids):
            raise ValueError("token_ids must be distinct: one probability per token")
        if not all(0.0 <= p <= 1.0 for p in self.probs) or abs(sum(self.probs) - 1.0) > 1e-3:
            raise ValueError("probs must be finite, in [0, 1] and sum to 1")
        return self


class DraftBranch(BaseModel):
    """Another way the main chain may go: `token_ids[0]` in place of the main chain's
    token at index `at` (the draft's next likeliest there), the rest drafted after it.
    Lead keeps it, and if it emits that token there, the rest is the next step's draft
    at once. Branches hang off the main chain only (a tree two levels deep)."""

    model_config = ConfigDict(extra="forbid")
    at: int = Field(ge=0, lt=MAX_DRAFT_WIRE, description="index into the main token_ids")
    token_ids: list[int] = Field(min_length=1, max_length=MAX_DRAFT_WIRE)
    dists: list[DraftDist] | None = None


class DraftPost(BaseModel):
    model_config = ConfigDict(extra="forbid")
    session_id: str = Field(max_length=64)  # lead's own ids are ~12 characters
    start: int = Field(ge=0, description="position of token_ids[0] in the session's tokens")
    token_ids: list[int] = Field(min_length=1, max_length=MAX_DRAFT_WIRE)
    dists: list[DraftDist] | None = None
    probs: list[float] | None = Field(
        None, max_length=MAX_DRAFT_WIRE,
        description="per draft token, the draft model's probability of it: lead learns per "
                    "back how these map to its acceptance and verifies as far as pays")
    back_id: str = Field("", max_length=64)
    branches: list[DraftBranch] = Field(default_factory=list, max_length=MAX_BRANCHES)

    @model_validator(mode="after")
    def _dists_match(self) -> DraftPost:
        if self.dists is not None and len(self.dists) != len(self.token_ids):
            raise ValueError("dists must have one entry per draft token")
        if self.probs is not None and (len(self.probs) != len(self.token_ids)
                                       or not all(0.0 <= p <= 1.0 for p in self.probs)):
            raise ValueError("probs must have one entry per draft token, each in [0, 1]")
        for i, branch in enumerate(self.branches):
            _check_branch(i, branch, self.token_ids, self.dists is not None)
        if sum(len(b.token_ids) for b in self.branches) > MAX_BRANCH_TOKENS:
            raise ValueError(f"branches hold more than {MAX_BRANCH_TOKENS} tokens in all")
        return self


def _check_branch(i: int, branch: DraftBranch, main: list[int], with_dists: bool) -> None:
    where = f"branches[{i}]"
    if branch.at >= len(main):
        raise ValueError(f"{where}.at: {branch.at} is past the main chain ({len(main)} tokens)")
    if branch.token_ids[0] == main[branch.at]:
        raise ValueError(f"{where}.token_ids[0] is the main chain's own token there")
    if (branch.dists is not None) != with_dists:
        raise ValueError(f"{where}.dists: give dists on every branch or on none, as on "
                         "the main chain")
    if branch.dists is not None and len(branch.dists) != len(branch.token_ids):
        raise ValueError(f"{where}.dists must have one entry per token")


class SessionState(BaseModel):
    """One session as the link's updates carry it (GET /duo/link): what State says of its
    session, with tokens from `offset` on (the first this back has not been sent)."""

    session_id: str
    offset: int = 0
    token_ids: list[int] = Field(default_factory=list)
    n_tokens: int = 0
    n_prompt: int = 0
    done: bool = False
    draft_len: int = 0
    stop: str | None = Field(Stop.UNPAID, description=STOP)
    sampling: SamplingParams | None = Field(None, description="sent in a session's first "
                                            "update to a back; null: as sent before")
    grammar_id: str | None = None
    your_accepted: int = 0

    @model_validator(mode="before")
    @classmethod
    def _from_older_lead(cls, data: Any) -> Any:
        return _stop_of(data)

    def as_state(self, version: int, lead_id: str,
                 sampling: SamplingParams | None = None, step_left_s: float | None = None
                 ) -> State:
        """The same news as a State, as a back's mirror holds it (`sampling`: the session's,
        where this update does not carry it; `step_left_s`: the update's)."""
        return State(version=version, lead_id=lead_id, **self.model_dump(
            exclude={"sampling"}), sampling=self.sampling or sampling or SamplingParams(),
            step_left_s=step_left_s)


class Update(BaseModel):
    """Lead to back on the link: the sessions changed since its last update (each with the
    tokens it has not been sent), and the global news."""

    type: Literal["update"] = "update"
    version: int
    lead_id: str = LEAD_ID
    sessions: list[SessionState] = Field(default_factory=list)
    ended: list[str] = Field(default_factory=list, description="sessions gone from lead "
                             "since the last update (their last state said done)")
    step_left_s: float | None = Field(None, ge=0, description=STEP_LEFT)


class Refused(BaseModel):
    """Lead to back on the link: a message of the back's that lead refused, as the HTTP
    routes would answer it (status, message, the field at fault)."""

    type: Literal["refused"] = "refused"
    status: int
    message: str
    param: str | None = None
    retry_after: float = 0.0
    session_id: str | None = Field(None, description="the refused draft's session")


class Hello(BaseModel):
    """Back to lead on the link, first and again whenever it changes: who the back is and
    what news it wants."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["hello"] = "hello"
    back_id: str = Field("", max_length=64)
    kind: str = Field("", max_length=16, description="its drafter (model, ngram)")
    idle: bool = Field(False, description="it sits out: news only of sessions starting "
                       "and ending")
    quiet: list[str] = Field(default_factory=list, max_length=64, description="sessions it "
                             "does not draft for now: news of them only when they want "
                             "drafts or end")
    ignored: list[str] = Field(default_factory=list, max_length=64, description="sessions it "
                               "does not follow at all (no slot was free): news of their end "
                               "only")


class Posted(BaseModel):
    """Back to lead on the link: a draft post (the link's `draft` message)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["draft"] = "draft"
    draft: DraftPost


BackMessage = Annotated[Hello | Posted, Field(discriminator="type")]

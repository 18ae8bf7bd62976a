"""A request made ready to generate: its prompt through the chat template, its tokens, its
grammar, checked against the model. The expensive part of a request before decoding, so
it runs on a worker thread (lead/apis/openairoutes.py), never on the event loop nor the model
thread, while the request holds its place in line. Every refusal is a 400 naming what is
wrong, raised from here as from the event loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lead.apis import shapes, structured, toolreply
from lead.apis.thinking import ThinkSplit, starts_inside
from lead.apis.tools import ToolPlan
from lead.decode.session import GenRequest
from shared import dry
from shared.model import Model


@dataclass(frozen=True)
class Prepared:
    req: GenRequest
    plan: ToolPlan | None = None  # a chat request's tools
    thinks: bool = False  # the reply may open with reasoning (a thinking model's)
    inside: bool = False  # the prompt opened the reasoning: the reply starts in it
    prompt: str = ""  # a chat's prompt as the template rendered it (llama-server's __verbose)

    def deltas(self) -> toolreply.Deltas:
        """A streamed reply's parser."""
        return toolreply.Deltas(self.plan, self._think())

    def parts(self, text: str) -> toolreply.Parts:
        """A whole reply's reasoning, content and calls."""
        return toolreply.reply_parts(text, self.plan, self._think())

    def _think(self) -> ThinkSplit | None:
        return ThinkSplit(self.inside) if self.thinks else None


@dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets: lead's --max-tokens (0: up to the
    context's end), --temp (0: greedy), --seed (None: a new one a request)."""

    max_tokens: int = 0
    temperature: float = 0.0
    seed: int | None = None
    reasoning: bool = True  # a thinking model's reasoning apart from the content (else in it)
    verbose: bool = False  # every whole chat reply with llama-server's __verbose (--verbose)
    # --top-k, --min-p, ...: what a request that leaves such a field out gets
    samplers: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def prepare_chat(model: Model, defaults: Defaults, body: shapes.ChatRequest) -> Prepared:
    plan, prompt, prompt_ids = chat_ids(model, body)
    thinks = defaults.reasoning and model.thinks and body.thinking is not False
    return Prepared(gen_request(model, defaults, body, prompt_ids, plan), plan,
                    thinks, thinks and starts_inside(prompt), prompt)


def chat_ids(model: Model, body: shapes.ChatRequest) -> tuple[ToolPlan, str, list[int]]:
    """The request's tool plan, its prompt and its tokens (what a count of them counts)."""
    plan, prompt = chat_prompt(model, body)
    return plan, prompt, model.tokenize(prompt, special=True, add_bos=False)


def chat_prompt(model: Model, body: shapes.ChatRequest) -> tuple[ToolPlan, str]:
    """The request's tool plan and its prompt as the model's template renders it."""
    try:
        return toolreply.chat_prompt(model, body)
    except ValueError as exc:  # the model's template refuses these messages
        raise shapes.FieldRefused("messages", f"messages: the chat template refuses them: "
                                              f"{exc}") from None


def prepare_completion(model: Model, defaults: Defaults,
                       body: shapes.CompletionRequest) -> Prepared:
    prompt_ids = fim_ids(model, body.prompt, body.suffix) if body.suffix else \
        model.tokenize(body.prompt, special=False, add_bos=True)
    return Prepared(gen_request(model, defaults, body, prompt_ids, None))


def fim_ids(model: Model, prefix: str, suffix: str) -> list[int]:
    """Fill in the middle, as the model was trained for it (prefix, suffix, middle:
    llama.cpp's order): the reply is what goes between `prefix` and `suffix`."""
    if model.fim_tokens is None:
        raise shapes.FieldRefused("suffix", f"suffix: {model.name} has no fill-in-the-middle "
                                         "tokens (Qwen2.5-Coder, the default target, has)")
    pre, suf, mid = model.fim_tokens
    return [*model.tokenize("", add_bos=True), pre,
            *model.tokenize(prefix, special=False, add_bos=False), suf,
            *model.tokenize(suffix, special=False, add_bos=False), mid]


def gen_request(model: Model, defaults: Defaults, body: shapes.CommonRequest,
                prompt_ids: list[int], plan: ToolPlan | None) -> GenRequest:
    n_ctx = model.n_ctx
    field = "messages" if isinstance(body, shapes.ChatRequest) else "prompt"
    if not prompt_ids:
        raise shapes.FieldRefused(field, f"{field}: the prompt is empty")
    if len(prompt_ids) >= n_ctx:
        raise shapes.ContextExceeded(field, len(prompt_ids), n_ctx)
    # A max_tokens past what the context holds is no error (llama-server's way; agents ask
    # for 32k): the reply ends where the context does, finish_reason "length".
    wanted = body.wanted_tokens()
    outside = [t for t in body.logit_bias or {} if t >= model.n_vocab]
    if outside:
        raise shapes.FieldRefused("logit_bias", f"logit_bias: token id {outside[0]} is outside "
                                             f"the vocabulary (0-{model.n_vocab - 1})")
    forced = toolreply.forced_grammar(plan, model) if plan is not None else None
    params = dry.with_restarts(body.sampling(defaults.temperature, defaults.samplers), model)
    if body.seed is None and defaults.seed is not None:
        params = params.model_copy(update={"seed": defaults.seed})
    constrained = structured.constraint_of(body, model, forced)
    if constrained is not None:
        params = params.model_copy(update={"grammar": constrained[0]})
    return GenRequest(prompt_ids, wanted or defaults.max_tokens or n_ctx, params, body.stops(),
                      body.top_logprobs_wanted(),
                      constraint=constrained[1] if constrained else None, slot=body.id_slot,
                      progress=body.return_progress and body.stream)

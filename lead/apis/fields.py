"""Every field of each API lead speaks, and what lead does with it: served (it changes the
reply as the API says), accepted (a hint, metadata, or a capability the model lacks whose
absence changes nothing the client relies on: taken and answered truthfully), or refused
(it would silently change the result: a 400 in the API's own words, so that clients'
fallbacks recognise it). docs/api.md lists the same tables; a test keeps them equal.

A field no table names is ignored and logged, as llama-server and vLLM do: clients add
fields faster than servers learn them, and refusing one the official API has just added
breaks every request of the client that sends it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger("lead")
Verdict = Literal["served", "accepted", "refused"]


@dataclass(frozen=True)
class Rule:
    verdict: Verdict
    why: str
    # a refused field's values that change nothing, accepted all the same (modalities: text)
    harmless: Callable[[Any], bool] | None = None


def served(why: str) -> Rule:
    return Rule("served", why)


def accepted(why: str) -> Rule:
    return Rule("accepted", why)


def refused(why: str, harmless: Callable[[Any], bool] | None = None) -> Rule:
    return Rule("refused", why, harmless)


SAMPLING = {
    "temperature": served("greedy below 1e-4 and by default, whatever the API's default"),
    "top_p": served("nucleus sampling"),
    "top_k": served("top-k sampling (llama-server's, Anthropic's)"),
    "min_p": served("min-p sampling (llama-server's)"),
    "seed": served("a seeded request samples the same reply again"),
    "stop": served("stop strings, never leaked into the reply"),
    "stream": served("server-sent events in the API's own shape"),
}
# llama-server's, in its default order after the penalties (lead/apis/llamasampling.py)
LLAMA_SAMPLING = {
    "dry_multiplier": served("llama-server's DRY: a token extending a repeat of the context "
                             "loses multiplier * base ^ (length - allowed); 0 is off"),
    "dry_base": served("DRY's base (below 1: llama-server's 1.75)"),
    "dry_allowed_length": served("DRY: the longest repeat free of penalty"),
    "dry_penalty_last_n": served("DRY's window (-1: the whole context, 0: off)"),
    "dry_sequence_breakers": served("DRY: texts a repeat stops at, as the model's tokens"),
    "typical_p": served("llama-server's locally typical sampling"),
    "min_keep": served("the fewest tokens top-p, min-p, typical_p and XTC leave"),
    "xtc_probability": served("llama-server's XTC: the chance the likeliest tokens are "
                              "excluded, drawn from the seeded generator"),
    "xtc_threshold": served("XTC: each token this likely but the least of them is excluded"),
    "mirostat": served("llama-server's mirostat 1 or 2, in place of the truncation samplers "
                       "and the penalties (the bias stays)"),
    "mirostat_tau": served("mirostat's target surprise"),
    "mirostat_eta": served("mirostat's learning rate"),
}
OPENAI_COMMON = {
    **SAMPLING,
    "model": accepted("lead serves the one model it loaded, whatever the name"),
    "max_tokens": served("at most this many tokens (past the context: up to its end)"),
    "max_completion_tokens": served("as max_tokens"),
    "n": served("n choices, decoded side by side in lead's slots"),
    "frequency_penalty": served("OpenAI's penalty over the reply's tokens"),
    "presence_penalty": served("OpenAI's penalty over the reply's tokens"),
    "repeat_penalty": served("llama.cpp's penalty over the last repeat_last_n tokens"),
    "repeat_last_n": served("llama.cpp's window for repeat_penalty"),
    "logit_bias": served("added to the token's logit"),
    "logprobs": served("each token's logprob (and top_logprobs)"),
    "response_format": served("text, json_object (llama-server's schema too), json_schema"),
    "grammar": served("a GBNF grammar, as llama-server takes it"),
    "json_schema": served("llama-server's: the reply follows this JSON schema"),
    "user": accepted("metadata"),
    "metadata": accepted("metadata"),
    "store": accepted("nothing is stored: there is nothing to fetch later"),
    "service_tier": accepted("one tier"),
    "safety_identifier": accepted("metadata"),
    "prompt_cache_key": accepted("lead caches every prompt by its tokens"),
    "prompt_cache_retention": accepted("lead keeps prompts while memory allows"),
    "stream_options": served("include_usage: the usage (and llama-server's timings) in a "
                             "last chunk of its own, with no choices; without it, on the "
                             "finish chunk"),
    "cache_prompt": accepted("llama-server's: lead always caches"),
    "return_progress": served("llama-server's: a streamed reply's chunks tell how far its "
                              "prompt's evaluation is (prompt_progress: total, cache, "
                              "processed, time_ms), after each batch lead evaluates"),
    "timings_per_token": served("llama-server's: each streamed token's chunk carries the "
                                "timings so far"),
    "id_slot": served("llama-server's: the slot the request runs in, once it is free (-1: "
                      "the one holding most of the prompt)"),
    "samplers": accepted("llama-server's order of samplers: lead's order is llama.cpp's "
                         "default"),
    "functions": refused("the legacy form of tools: send tools"),
    "function_call": refused("the legacy form of tool_choice: send tool_choice"),
    "audio": refused("the model writes text, not audio"),
    "modalities": refused("the model writes text only", lambda v: v == ["text"]),
    **LLAMA_SAMPLING,
}
CHAT = {
    **OPENAI_COMMON,
    "messages": served("system, developer, user, assistant, tool; text parts; an "
                       "assistant's reasoning_content where the template renders it"),
    "top_logprobs": served("the n likeliest tokens at each position (up to 20)"),
    "tools": served("function tools, through the model's own chat template"),
    "tool_choice": served("auto, none, required, a named function (a grammar forces it)"),
    "parallel_tool_calls": accepted("a reply may hold several calls; false is a hint"),
    "reasoning_effort": served("a template with a thinking switch (Qwen3's) gets it: "
                               "\"none\" off, else on; the reasoning comes as "
                               "reasoning_content. Elsewhere a hint the model cannot take"),
    "chat_template_kwargs": served("llama-server's: enable_thinking for templates that "
                                   "have it; other keys are ignored"),
    "verbosity": accepted("a hint the model cannot take"),
    "prediction": accepted("predicted outputs change only the speed"),
    "web_search_options": refused("lead has no web search"),
}
COMPLETIONS = {
    **OPENAI_COMMON,
    "prompt": served("the text to continue"),
    "suffix": served("fill in the middle, in the model's own format"),
    "echo": refused("echoing the prompt is not served", lambda v: v is False),
    "tools": refused("tools are served by /v1/chat/completions"),
    "tool_choice": refused("tools are served by /v1/chat/completions"),
    "best_of": refused("best_of is not served", lambda v: v == 1),
}


class Unserved(ValueError):
    """A field refused: `param`, and the rule that refuses it."""

    def __init__(self, param: str, value: Any, rule: Rule) -> None:
        super().__init__(f"{param}: {rule.why}")
        self.param, self.value, self.rule = param, value, rule


def judge(table: dict[str, Rule], given: dict[str, Any], api: str, where: str = "") -> None:
    """Raise Unserved for the first field of `given` (the fields a request model did not
    declare) the table refuses; log those no table names. A field set to null counts as
    absent: many clients send their unset options so."""
    unknown = []
    for name, value in given.items():
        rule = table.get(name)
        if value is None or (rule is not None and rule.verdict != "refused"):
            continue
        if rule is None:
            unknown.append(where + name)
        elif rule.harmless is None or not rule.harmless(value):
            raise Unserved(where + name, value, rule)
    if unknown:
        log.warning("%s: ignored fields no API of lead's knows: %s", api, ", ".join(unknown))


RESPONSES = {
    **{k: SAMPLING[k] for k in ("temperature", "top_p", "stream")},
    "model": accepted("lead serves the one model it loaded, whatever the name"),
    "input": served("text, or messages, function calls and their outputs (reasoning "
                    "and web-search items of earlier turns are skipped)"),
    "instructions": served("the system message"),
    "max_output_tokens": served("at most this many tokens (past the context: up to its end)"),
    "return_progress": served("llama-server's: response.in_progress events with "
                              "prompt_progress as the prompt is evaluated"),
    "timings_per_token": served("llama-server's: each text delta with the timings so far "
                                "(response.completed has them always)"),
    "text": served("format (text, json_object, json_schema); verbosity is a hint"),
    "tools": served("function tools, those in a namespace, custom tools (their input as "
                    "one string); hosted tools lead has none of (web search, file search, "
                    "code interpreter ...) are not offered to the model"),
    "tool_choice": served("auto, none, required, a named function"),
    "include": served("message.output_text.logprobs; any other inclusion (reasoning's "
                      "encrypted content ...) has nothing to include"),
    "top_logprobs": served("the n likeliest tokens at each position"),
    "parallel_tool_calls": accepted("a reply may hold several calls; false is a hint"),
    "reasoning": served("a template with a thinking switch (Qwen3's) gets effort: "
                        "\"none\" off, else on; the reasoning comes as a reasoning item. "
                        "Elsewhere hints: the model writes no reasoning items"),
    "store": accepted("nothing is stored: there is nothing to fetch later"),
    "truncation": accepted("a conversation over the context is a 400 either way"),
    "metadata": accepted("metadata"),
    "user": accepted("metadata"),
    "client_metadata": accepted("metadata (Codex's)"),
    "service_tier": accepted("one tier"),
    "safety_identifier": accepted("metadata"),
    "prompt_cache_key": accepted("lead caches every prompt by its tokens"),
    "prompt_cache_retention": accepted("lead keeps prompts while memory allows"),
    "stream_options": accepted("no obfuscation is added"),
    "max_tool_calls": accepted("a hint"),
    "previous_response_id": refused("responses are not stored: send the whole "
                                    "conversation as input"),
    "conversation": refused("conversations are not stored: send the whole conversation "
                            "as input"),
    "background": refused("background responses are not served", lambda v: v is False),
    "prompt": refused("stored prompt templates are not served"),
}

MESSAGES = {
    **{k: SAMPLING[k] for k in ("temperature", "top_p", "top_k", "stream")},
    "model": accepted("lead serves the one model it loaded, whatever the name"),
    "max_tokens": served("at most this many tokens (past the context: up to its end)"),
    "messages": served("text, tool_use and tool_result blocks; a system message in "
                       "place; earlier turns' thinking as the template renders an "
                       "assistant's reasoning_content; redacted thinking and server "
                       "tools' blocks skipped"),
    "system": served("text or text blocks"),
    "stop_sequences": served("stop strings; the one that ended the reply is named"),
    "tools": served("client tools; server tools lead has none of (web search, web fetch, "
                    "code execution ...) are not offered to the model"),
    "tool_choice": served("auto, any, tool, none"),
    "thinking": served("a template with a thinking switch (Qwen3's) gets it: enabled and "
                       "adaptive on, disabled off; the reasoning comes as a thinking block. "
                       "Elsewhere a hint: the model writes no thinking blocks"),
    "output_config": served("format (a JSON schema the reply follows); effort is a hint"),
    "output_format": served("the reply follows this JSON schema (the beta's name)"),
    "context_management": accepted("nothing is cleared: the conversation is read as sent"),
    "metadata": accepted("metadata"),
    "service_tier": accepted("one tier"),
    "container": accepted("no code runs on lead"),
    "inference_geo": accepted("lead runs where it runs"),
    "mcp_servers": refused("lead connects to no MCP servers", lambda v: not v),
}

INFILL = {
    **{k: SAMPLING[k] for k in ("temperature", "top_p", "top_k", "min_p", "seed", "stop",
                                "stream")},
    **{k: OPENAI_COMMON[k] for k in ("repeat_penalty", "repeat_last_n", "frequency_penalty",
                                     "presence_penalty", "cache_prompt", "id_slot")},
    **LLAMA_SAMPLING,
    "input_prefix": served("the text before the cursor"),
    "input_suffix": served("the text after the cursor"),
    "prompt": served("the cursor's line typed so far"),
    "input_extra": served("other files' chunks, placed as llama-server places them"),
    "n_predict": served("at most this many tokens; 0 evaluates the prompt only (a warm-up)"),
    "n_indent": served("the reply ends at a line indented less"),
    "t_max_predict_ms": served("the reply ends at a new line once this long has passed"),
    "t_max_prompt_ms": accepted("llama-server does not enforce it either"),
    "samplers": served("a sampler left out is off; their order is lead's own"),
    "n_cmpl": served("one completion (greedy ones are alike); more with a temperature: a "
                     "400"),
    "response_fields": served("the reply holds only these fields"),
    "model": accepted("lead serves the one model it loaded, whatever the name"),
    "lora": refused("LoRA adapters are not served", lambda v: not v),
    "ignore_eos": refused("the end of text always ends the reply", lambda v: v is False),
}

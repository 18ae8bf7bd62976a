"""What an embeddings request's `input` (or `content`) may be, as llama-server reads it
(tokenize_input_prompts), and each input's token ids (pure, over the model's tokenizer).

One input: a string, token ids, ids and strings mixed ([12, "text", 34]), an object
{"prompt_string": ...} or {"content": [{"type": "text", "text": ...}, ...]} (its texts
joined). Several: a list of those (a list holding any id directly is one mixed input).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lead.apis.shapes import FieldRefused
from shared.model import Model

MAX_INPUTS = 2048  # inputs in one request, as OpenAI's embeddings API allows
Prompt = list[int | str]  # one input's text and token ids, in order
SHAPES = ("must be a string, a list of tokens, a JSON object containing a prompt string, "
          "or a list of mixed strings & tokens")
EMPTY = "Input content cannot be empty"
TOO_LARGE = "input is too large to process. increase the physical batch size"


def prompts(value: Any, field: str) -> list[Prompt]:
    """The request's inputs, each a Prompt; a 400 naming the first that is none."""
    if isinstance(value, list) and any(_is_id(v) for v in value):
        return [subprompt(value, field)]
    if not isinstance(value, list):
        return [subprompt(value, field)]
    if not value:
        raise FieldRefused(field, f"{field} must not be empty")
    if len(value) > MAX_INPUTS:
        raise FieldRefused(field, f"{field}: {len(value)} inputs; at most {MAX_INPUTS} in "
                                  "one request")
    return [subprompt(v, f"{field}[{i}]") for i, v in enumerate(value)]


def subprompt(value: Any, where: str) -> Prompt:
    if isinstance(value, str):
        return [_text(value, where)]
    if isinstance(value, list) and all(_is_id(v) or isinstance(v, str) for v in value):
        return [_text(v, f"{where}[{i}]") if isinstance(v, str) else v
                for i, v in enumerate(value)]
    if isinstance(value, dict):
        return _object(value, where)
    raise FieldRefused(where, f"{where} {SHAPES}")


def _object(value: dict[str, Any], where: str) -> Prompt:
    if "multimodal_data" in value:
        raise FieldRefused(f"{where}.multimodal_data", "Multimodal data provided, but model "
                                                       "does not support multimodal requests.")
    if "prompt_string" in value:
        return subprompt(value["prompt_string"], f"{where}.prompt_string")
    if "content" in value:
        return [_parts(value["content"], f"{where}.content")]
    raise FieldRefused(where, f"{where} {SHAPES}")


def _parts(content: Any, where: str) -> str:
    """A message's content parts as one text; the model reads text only."""
    if not isinstance(content, list):
        raise FieldRefused(where, f"{where} must be a list of content parts")
    texts = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") == "text"
                and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else None
            raise FieldRefused(f"{where}[{j}]", f"{where}[{j}]: only text parts are read "
                                                f"(this model is not multimodal), not {kind!r}")
        texts.append(_text(part["text"], f"{where}[{j}].text"))
    return "".join(texts)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(text: str, where: str) -> str:
    # JSON admits a lone surrogate ("\ud800"); no tokenizer takes one.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FieldRefused(where, f"{where}: text is not valid Unicode: {exc.reason}") from None
    return text


def prompt_ids(model: Model, prompt: Prompt, where: str, limit: int) -> list[int]:
    """An input's ids as llama-server makes them (special tokens parsed, the model's
    special tokens where it adds them, before the first piece only); ids the model has,
    1 to `limit` of them, else a 400."""
    ids = piece_ids(model, prompt, lambda _: where)
    if not ids:
        raise FieldRefused(where, f"{EMPTY} ({where} has no tokens)")
    if len(ids) > limit:
        raise FieldRefused(where, f"{TOO_LARGE}: {where} has {len(ids)} tokens; at most "
                                  f"{limit} are embedded at once (--ubatch-size, --batch-size)")
    return ids


def piece_ids(model: Model, prompt: Prompt, where: Callable[[int], str]) -> list[int]:
    """Text tokenized as llama-server does (special tokens parsed, the model's BOS before
    text that opens the prompt), ids as given; an id the model lacks is a 400 naming
    `where(i)`, the field of piece i."""
    ids: list[int] = []
    for i, piece in enumerate(prompt):
        if isinstance(piece, str):
            ids += model.tokenize(piece, special=True, add_bos=i == 0)
        elif 0 <= piece < model.n_vocab:
            ids.append(piece)
        else:
            raise FieldRefused(where(i), f"{where(i)}: {piece} is no token id of "
                                         f"{model.name} (0-{model.n_vocab - 1})")
    return ids

"""llama.cpp's grammar sampler as a Constraint (shared/grammar/constraint.py), and JSON schemas
to GBNF. Part of the llama.cpp edge (shared/llama/model.py, which routes llama.cpp's log here
while a grammar parses); nothing else imports llama_cpp for grammars."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import sys
import tempfile
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp.llama_grammar import (
    PRIMITIVE_RULES,
    RESERVED_NAMES,
    STRING_FORMAT_RULES,
    SchemaConverter,
)

from shared.grammar.bounds import check_gbnf
from shared.grammar.schema_bounds import check_schema
from shared.grammar.schema_keywords import ENFORCED, unenforced
from shared.grammar.schema_pattern import for_grammar
from shared.grammar.schema_shapes import check_shapes, wrapped

captured = threading.local()  # .lines: where this thread's llama.cpp log goes, if set


_TokenData = np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)], align=True)


class _Candidates:
    """A llama_token_data_array over numpy storage, reused for every call."""

    def __init__(self, n: int) -> None:
        self.data = np.zeros(n, dtype=_TokenData)
        self.array = llama_cpp.llama_token_data_array(
            data=self.data.ctypes.data_as(llama_cpp.llama_token_data_p), size=n, selected=-1,
            sorted=False)

    def filter(self, sampler: llama_cpp.llama_sampler_p, ids: np.ndarray | int,
               logits: np.ndarray | float) -> np.ndarray:
        """The logits as the sampler leaves them (-inf where it refuses a token)."""
        self.data["id"], self.data["logit"], self.data["p"] = ids, logits, 0.0
        self.array.size, self.array.selected, self.array.sorted = self.data.size, -1, False
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(self.array))
        return self.data["logit"]


class _Grammar:
    """What the states of one parsed grammar share; used on one thread at a time."""

    def __init__(self, n_vocab: int, eos_token_ids: frozenset[int]) -> None:
        self.eos = np.fromiter(sorted(eos_token_ids), dtype=np.int64)
        self.eos_set = eos_token_ids
        self.ids = np.arange(n_vocab, dtype=np.intc)
        self.row = _Candidates(n_vocab)
        self.one = _Candidates(1)


class GrammarState:
    """A Constraint (shared/grammar/constraint.py) over llama.cpp's grammar sampler: apply masks,
    accept advances, clone copies. Its sampler is freed with it."""

    def __init__(self, sampler: llama_cpp.llama_sampler_p, grammar: _Grammar) -> None:
        self._sampler, self._grammar = sampler, grammar
        finalizer = weakref.finalize(self, llama_cpp.llama_sampler_free, sampler)
        finalizer.atexit = False  # the library may be gone by then

    @classmethod
    def parse(cls, vocab: llama_cpp.llama_vocab_p, n_vocab: int, eos_token_ids: frozenset[int],
              gbnf: str) -> GrammarState:
        if not gbnf.strip():
            raise ValueError("the grammar is empty")
        check_gbnf(gbnf)  # llama.cpp's parser has no limits of its own
        printed: list[bytes] = []
        captured.lines = []
        try:
            with _stderr_kept(printed):
                sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        finally:
            lines, captured.lines = captured.lines, None
        if not sampler:
            raise ValueError(_parse_error(b"".join(printed).decode("utf-8", "replace"), lines))
        if printed:
            os.write(2, b"".join(printed))  # not about this grammar: passed on
        return cls(sampler, _Grammar(n_vocab, eos_token_ids))

    def allows(self, token_id: int) -> bool:
        return bool(np.isfinite(self._grammar.one.filter(self._sampler, token_id, 0.0)[0]))

    def mask(self, row: np.ndarray) -> np.ndarray:
        grammar = self._grammar
        refused = np.isneginf(grammar.row.filter(self._sampler, grammar.ids, row))
        out = row.copy()
        out[refused] = -np.inf
        if refused.all():  # a grammar no token can go on with: end the reply
            out[grammar.eos] = row[grammar.eos]
        return out

    def advanced(self, tokens: Sequence[int]) -> GrammarState:
        state = GrammarState(llama_cpp.llama_sampler_clone(self._sampler), self._grammar)
        for token in tokens:
            if token in self._grammar.eos_set:  # it ends the reply: never passed to llama.cpp,
                continue  # which aborts the process on an EOG its grammar cannot end at
            if not state.allows(token):  # the same for any token it refuses
                raise ValueError(f"the grammar does not allow token {token} here")
            llama_cpp.llama_sampler_accept(state._sampler, token)
        return state


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_kept(printed: list[bytes]) -> Iterator[None]:
    """What is written to fd 2 meanwhile goes to `printed`: llama.cpp's grammar parser
    prints why a grammar fails there, with fprintf, and the client should read it."""
    with _stderr_lock, tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            printed.append(sink.read())


def _parse_error(printed: str, logged: list[str]) -> str:
    """"expecting ')' at ..." from "parse: error parsing grammar: expecting ')' at ...";
    else what llama.cpp logged (e.g. "grammar does not contain a 'root' symbol")."""
    _, found, reason = printed.partition("error parsing grammar: ")
    if found:
        return " ".join(reason.partition("\n\n")[0].split())[:300]  # then its source
    message = " ".join(" ".join(line.split()) for line in logged if line.strip())
    return message or "the grammar does not parse"


def schema_grammar(schema: dict[str, Any], strict: bool = True) -> str:
    """GBNF for JSON valid against `schema` (llama-cpp-python's converter, as llama.cpp's
    server's, lengths written as llama.cpp's own converter writes them); ValueError for a
    schema over a bound (shared/grammar/schema_bounds.py) or it cannot convert, or, if `strict`,
    one with a keyword it would not enforce."""
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema is an object")
    check_schema(schema)
    check_shapes(schema)
    if strict and (keyword := unenforced(schema)) is not None:
        raise ValueError(f"{keyword} is not enforced here (supported: "
                         f"{', '.join(sorted(ENFORCED))}); strict: false ignores it")
    try:
        grammar = _convert(schema)
    except RecursionError:
        raise ValueError("the schema nests too deeply") from None
    except Exception as exc:  # its converter asserts, and fails on shapes it does not know
        raise ValueError(f"unsupported or invalid JSON schema: {exc or type(exc).__name__}") \
            from None
    # This converter lets control characters into strings, which JSON forbids (a newline
    # in a string failed json.loads); llama.cpp's own converter excludes them, as here.
    grammar = grammar.replace(_LOOSE_CHAR, _JSON_CHAR)
    check_gbnf(grammar, "the grammar this schema converts to")
    return grammar


_LOOSE_CHAR = r'char ::= [^"\\] |'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] |'


def _convert(schema: dict[str, Any]) -> str:
    """llama_cpp.llama_grammar.json_schema_to_gbnf, over _FlatConverter."""
    converter = _FlatConverter(prop_order={}, allow_fetch=False, dotall=False,
                               raw_pattern=False)
    converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
    return converter.format_grammar()


class _FlatConverter(SchemaConverter):
    """llama-cpp-python's converter writes a string's or an array's length range {m,n} as
    n - m nested groups, and llama.cpp's parser recurses once per group (a maxLength of
    60,000 overflowed the stack). This one writes x{m,n}, as llama.cpp's own converter
    does: its parser unrolls that without recursing, up to MAX_REPEAT. Everything else,
    and the order in which keywords are taken, is the parent's."""

    def visit(self, schema: dict[str, Any], name: str) -> str:
        if (member := wrapped(schema)) is not None:  # the parent merges it as an object
            return self.visit(member, name)
        rule = name + "-" if name in RESERVED_NAMES else name or "root"
        if _length_string(schema):
            char = self._add_primitive("char", PRIMITIVE_RULES["char"])
            chars = _repeat(char, schema.get("minLength", 0), schema.get("maxLength"))
            return str(self._add_rule(rule, rf'"\"" {chars} "\"" space'))
        if _item_array(schema):
            item = self.visit(schema["items"], f"{name}{'-' if name else ''}item")
            items = _items(item, self._add_rule(f"{item}-next", f'"," space {item}'),
                           schema.get("minItems", 0), schema.get("maxItems"))
            return str(self._add_rule(rule, f'"[" space {items} "]" space'))
        return str(super().visit(schema, name))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        """The parent's, over the pattern's escapes rewritten (shared/grammar/schema_pattern.py)."""
        return str(super()._visit_pattern(for_grammar(pattern), name))

    def _format_literal(self, literal: str) -> str:
        """A GBNF literal matching exactly `literal`. The parent escapes quotes but not
        backslashes, so the JSON escapes of an enum, a const or a property name were read
        as GBNF's own: "a\\"b" ended the literal early (a valid schema refused), and
        "\\ud83d\\udca5" became two lone surrogates (an emoji came out as U+FFFD)."""
        return '"' + _LITERAL_SPECIAL.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], literal) + '"'


_LITERAL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\r": "\\r", "\n": "\\n"}
_LITERAL_SPECIAL = re.compile(r'[\\"\r\n]')


_TAKEN_FIRST = frozenset({"$ref", "oneOf", "anyOf", "const", "enum"})  # by the parent


def _length_string(schema: dict[str, Any]) -> bool:
    """Where the parent writes a string's min/maxLength (and nothing before it applies)."""
    fmt = schema.get("format") or ""
    return schema.get("type") == "string" and \
        ("minLength" in schema or "maxLength" in schema) and \
        not (_TAKEN_FIRST | {"pattern"}) & schema.keys() and \
        not re.match(r"^uuid[1-5]?$", fmt) and f"{fmt}-string" not in STRING_FORMAT_RULES


def _item_array(schema: dict[str, Any]) -> bool:
    """Where the parent writes an array of `items` with min/maxItems."""
    kind = schema.get("type")
    object_first = kind is None and ("properties" in schema or "allOf" in schema or
                                     schema.get("additionalProperties", True) is not True)
    return kind in (None, "array") and isinstance(schema.get("items"), dict) and \
        bool(schema["items"]) and not _TAKEN_FIRST & schema.keys() and not object_first


def _items(item: str, then: str, low: int, high: int | None) -> str:
    """`item` repeated low to high times (None: no maximum), `then` (", item") between."""
    if high == 0:
        return ""
    rest = _repeat(then, max(low - 1, 0), None if high is None else high - 1)
    listed = f"{item} {rest}".strip()
    return listed if low > 0 else f"({listed})?"


def _repeat(item: str, low: int, high: int | None) -> str:
    """GBNF for `item` low to high times (None: no maximum)."""
    if high is None:
        return {0: f"{item}*", 1: f"{item}+"}.get(low, f"{item}{{{low},}}")
    if high == 0:
        return ""
    if low == high:
        return item if low == 1 else f"{item}{{{low}}}"
    return f"{item}?" if (low, high) == (0, 1) else f"{item}{{{low},{high}}}"

"""A deterministic fake model: the scripted stand-in for llama.cpp in tests and simulation.

Its logits are a pure function of the last `order` tokens of the context (and a
salt), so its greedy continuation is fixed and any two instances agree. A draft
fake can be made to agree with a target fake only part of the time.
Text maps one character to one token; a few tokens carry half of a UTF-8 character.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shared import slotfile
from shared.grammar.bounds import check_gbnf
from shared.grammar.schema_bounds import check_schema
from shared.grammar.schema_shapes import check_shapes
from shared.model import MAIN, EvaluationAborted, Part

ALPHABET = " abcdefghijklmnopqrstuvwxyz.,!?\n0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ:;()-'"
SPLIT_UTF8 = [b"\xc3", b"\xa9"]  # the two bytes of "é", as two tokens
EOS = 0  # token 0 is "<eos>"
SPIN_S = 0.0002  # the end of a simulated call, spun (see _spend)


class VirtualClock:
    """Seconds that pass only as fake models evaluate, by their nominal cost: prices read
    on it are exact however loaded the machine is. Call it for the time."""

    def __init__(self) -> None:
        self._now = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


class FakeModel:
    def __init__(self, n_vocab: int = 96, salt: str = "target", order: int = 3,
                 agree: float = 1.0, agree_salt: str = "target", n_ctx: int = 2048,
                 cover: float = 0.0, n_branches: int = 8,
                 eos_bias: float = 0.0, cost_s: tuple[float, float] = (0.0, 0.0),
                 name: str = "fake", clock: VirtualClock | None = None,
                 chat_template: str | None = None, fim: bool = False, slots: int = 1,
                 thinks: bool = False) -> None:
        """`slots`: generations held side by side (`slot(i)`, `evaluate_parts`); one call
        over several of them costs what one call of all their tokens costs."""
        assert n_vocab >= len(ALPHABET) + 3
        self.name, self.n_vocab, self.n_ctx = name, n_vocab, n_ctx
        self.chat_template = chat_template  # only read for its tool-call markers
        self.thinks = thinks  # whether its "template" has a thinking switch
        # fill-in-the-middle markers: the last three ids (text "~"), where asked for
        self.fim_tokens = (n_vocab - 3, n_vocab - 2, n_vocab - 1) if fim else None
        self.fim_repo_tokens: tuple[int | None, int | None] = \
            (n_vocab - 5, n_vocab - 4) if fim else (None, None)  # FIM_REP, FIM_SEP
        self.eos_token_ids = frozenset({EOS})
        self.salt, self.order, self.agree, self.agree_salt = salt, order, agree, agree_salt
        # where it disagrees, the share of contexts where the agree_salt model's token is
        # its second choice (a draft whose runner-up covers the target's token)
        self.cover = cover
        self.eos_bias = eos_bias
        self.cost_s = cost_s  # (seconds per call, seconds per token): simulated compute
        self.clock = clock  # advanced by each evaluation's nominal cost
        self.cached: list[int] = []
        # branch sequences are just more lists (shared/model.py)
        self.n_branches = n_branches
        self.can_fork = n_branches > 0
        self.branch_cached: list[list[int]] = [[] for _ in range(n_branches)]
        self._shared = [0] * n_branches  # per slot: the prefix it shares with `cached`
        self.evaluated = 0  # tokens evaluated in total (prefix-reuse tests read it)
        self.calls: list[int] = []  # batch size of every evaluate call
        self.slot_calls: list[int] = []  # slots in every call over several (evaluate_parts...)
        self.threads: set[int] = set()  # idents of the threads that evaluated
        self.n_slots = max(slots, 1)
        self._slots: list[FakeModel] = [self]

    def _sibling(self) -> FakeModel:
        """Another slot of this model: its settings (a subclass's too), its own sequences;
        one record of calls and threads for the model."""
        other = copy.copy(self)
        other.cached, other.evaluated = [], 0
        other.branch_cached = [[] for _ in range(self.n_branches)]
        other._shared = [0] * self.n_branches
        other._slots = [other]
        return other

    # --- text ---
    def tokenize(self, text: str, special: bool = False, add_bos: bool = True) -> list[int]:
        return [ALPHABET.index(c) + 1 if c in ALPHABET else 1 for c in text]

    def token_bytes(self, token_id: int) -> bytes:
        if token_id == EOS:
            return b""
        if 1 <= token_id <= len(ALPHABET):
            return ALPHABET[token_id - 1].encode()
        extra = token_id - len(ALPHABET) - 1
        return SPLIT_UTF8[extra] if extra < len(SPLIT_UTF8) else b"~"

    def format_chat(self, messages: list[dict[str, Any]],
                    tools: list[dict[str, Any]] | None = None,
                    add_generation_prompt: bool = True, thinking: bool | None = None) -> str:
        """Tools as "tools: name, name"; a message's calls as "calls: name(arguments)";
        a thinking switch as "thinking: on|off" where the fake thinks."""
        head = "tools: " + ", ".join(t["function"]["name"] for t in tools) + "\n" if tools \
            else ""
        if self.thinks and thinking is not None:
            head += f"thinking: {'on' if thinking else 'off'}\n"
        return head + "".join(_fake_turn(m) for m in messages) + \
            ("assistant: " if add_generation_prompt else "")

    def fingerprint(self) -> str:
        return f"fake-{self.n_vocab}"

    # --- compute ---
    def logits_for(self, context: Sequence[int]) -> np.ndarray:
        key = tuple(context[-self.order:])
        if self._agrees(key):
            return self._logits(self.agree_salt, key)
        logits = self._logits(self.salt, key)
        if self.cover > 0.0 and _share(("cover", key)) < self.cover:
            _make_second(logits, int(np.argmax(self._logits(self.agree_salt, key))))
        return logits

    def _logits(self, salt: str, key: tuple[int, ...]) -> np.ndarray:
        seed = int.from_bytes(hashlib.blake2b(repr((salt, key)).encode(), digest_size=8).digest())
        logits = np.random.default_rng(seed).normal(0.0, 2.0, self.n_vocab).astype(np.float32)
        logits[EOS] += self.eos_bias
        logits[len(ALPHABET) + 1:] -= 100.0  # only printable text: replies re-tokenize exactly
        return logits

    def _agrees(self, key: tuple[int, ...]) -> bool:
        return self.agree >= 1.0 or _share(("agree", key)) < self.agree

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        return self._append(self.cached, tokens, n_logits, abort)

    def fork(self, slot: int, n_keep: int) -> None:
        if not (0 <= slot < self.n_branches and 0 <= n_keep <= len(self.cached)):
            raise ValueError(f"cannot fork {n_keep} of {len(self.cached)} tokens to {slot}")
        self.branch_cached[slot] = self.cached[:n_keep]
        self._shared[slot] = n_keep

    def evaluate_many(self, tokens: Mapping[int, Sequence[int]],
                      abort: Callable[[], bool] | None = None) -> dict[int, np.ndarray]:
        return self.evaluate_many_slots([(0, tokens)], abort)[0]

    def evaluate_many_slots(self, calls: Sequence[tuple[int, Mapping[int, Sequence[int]]]],
                            abort: Callable[[], bool] | None = None
                            ) -> list[dict[int, np.ndarray]]:
        """Several slots' evaluate_many in one call (priced as one)."""
        started = time.perf_counter()
        planned = [(self.slot(i), self.slot(i)._many_parts(ts)) for i, ts in calls]
        n_tokens = sum(len(ts) for _, parts in planned for ts in parts.values())
        if n_tokens == 0:
            return [{} for _ in calls]
        out = [{key: model.logits_for(model._sequence(key) + ts) for key, ts in parts.items()}
               for model, parts in planned]
        self._spend(n_tokens, abort, started)
        self.calls.append(n_tokens)
        self.slot_calls.append(sum(1 for _, parts in planned if parts))
        for model, parts in planned:
            for key, ts in parts.items():
                model._sequence(key).extend(ts)
                model.evaluated += len(ts)
        return out

    def _many_parts(self, tokens: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
        parts = {key: list(ts) for key, ts in tokens.items() if ts}
        if any(key != MAIN and not 0 <= key < self.n_branches for key in parts):
            raise ValueError(f"no such sequence among {sorted(parts)}")
        if self._cells() + sum(len(ts) for ts in parts.values()) > self.n_ctx:
            raise RuntimeError("context full")  # one buffer of n_ctx cells, as llama.cpp's
        return parts

    def slot(self, i: int) -> FakeModel:
        if not 0 <= i < self.n_slots:
            raise ValueError(f"no slot {i} of {self.n_slots}")
        while len(self._slots) <= i:  # made when first used
            self._slots.append(self._sibling())
        return self._slots[i]

    def evaluate_parts(self, parts: Sequence[Part]) -> list[np.ndarray]:
        if len({p.slot for p in parts}) != len(parts):
            raise ValueError("one part per slot in a batch")
        if len(parts) == 1:  # the slot's own call (a subclass may watch evaluate)
            return [self._alone(parts[0])]
        started = time.perf_counter()
        for part in parts:  # all checked before any is applied: a failure changes nothing
            self.slot(part.slot)._check_part(part)
        self.threads.add(threading.get_ident())
        out = [self.slot(part.slot)._apply(part) for part in parts]
        n_tokens = sum(part.n_tokens for part in parts)
        self._spend(n_tokens, None, started)
        self.calls.append(n_tokens)
        self.slot_calls.append(len(parts))
        return out

    def _alone(self, part: Part) -> np.ndarray:
        return self.slot(part.slot).evaluate(part.tokens, part.n_logits)

    def share_prefix(self, source: int, target: int, n: int) -> None:
        giver, taker = self.slot(source), self.slot(target)
        if not 0 <= n <= len(giver.cached):
            raise ValueError(f"cannot share {n} tokens of slot {source} with slot {target}")
        if taker is not giver:
            taker.cached = giver.cached[:n]
        for branch in range(taker.n_branches):
            taker.fork(branch, 0)

    def save_slot(self, slot: int) -> bytes:
        """The slot's cells as bytes: here its token ids, 4 bytes each."""
        return np.asarray(self.slot(slot).cached, np.int32).tobytes()

    def load_slot(self, slot: int, tokens: Sequence[int], state: bytes) -> bool:
        taker = self.slot(slot)
        for branch in range(taker.n_branches):
            taker.fork(branch, 0)
        good = np.frombuffer(state, np.int32).tolist() == list(tokens)
        taker.cached = list(tokens) if good else []
        return good

    def save_slot_file(self, slot: int, path: str) -> int:
        """llama-server's slot file, its cells save_slot's (0: it could not be written)."""
        try:
            return slotfile.write(path, slotfile.packed(self.slot(slot).cached),
                                  self.save_slot(slot))
        except OSError:
            return 0

    def load_slot_file(self, slot: int, path: str) -> int:
        self.load_slot(slot, [], b"")  # refused or not, what it held is gone
        words, state, size = slotfile.read(path)
        if not self.load_slot(slot, slotfile.unpacked(words), state):
            raise ValueError(slotfile.UNREADABLE)
        return size

    def _check_part(self, part: Part) -> None:
        if self._cells() + part.n_tokens > self.n_ctx:
            raise RuntimeError("context full")

    def _apply(self, part: Part) -> np.ndarray:
        """Append the part's tokens; the rows after its last n_logits."""
        main = self.cached + list(part.tokens)
        rows = self._rows(main, len(main) - part.n_logits)
        self.evaluated += part.n_tokens
        self.cached.extend(part.tokens)
        return rows

    def _rows(self, sequence: list[int], start: int) -> np.ndarray:
        """The rows after each of sequence[start:]."""
        if start >= len(sequence):
            return np.zeros((0, self.n_vocab), np.float32)
        return np.stack([self.logits_for(sequence[:i + 1]) for i in range(start, len(sequence))])

    def _cells(self) -> int:
        """KV cells in use: the main sequence's, and each branch's beyond the prefix it
        shares with it (shared cells count once, as llama.cpp's unified cache holds them)."""
        return len(self.cached) + sum(len(b) - min(shared, len(b)) for b, shared in
                                      zip(self.branch_cached, self._shared, strict=True))

    def adopt(self, slot: int) -> None:
        self.cached, self.branch_cached[slot] = self.branch_cached[slot], self.cached
        # the others shared a prefix with the old main sequence; no more of it than it
        # shares with the new one
        self._shared = [s if i == slot else min(s, self._shared[slot])
                        for i, s in enumerate(self._shared)]

    def _sequence(self, key: int) -> list[int]:
        return self.cached if key == MAIN else self.branch_cached[key]

    def _append(self, sequence: list[int], tokens: Sequence[int], n_logits: int,
                abort: Callable[[], bool] | None) -> np.ndarray:
        if self._cells() + len(tokens) > self.n_ctx:
            raise RuntimeError("context full")
        self.threads.add(threading.get_ident())
        started, start = time.perf_counter(), len(sequence)
        grown = sequence + list(tokens)
        rows = [self.logits_for(grown[: start + i + 1])
                for i in range(len(tokens) - n_logits, len(tokens))]
        self._spend(len(tokens), abort, started)
        sequence.extend(tokens)
        self.evaluated += len(tokens)
        self.calls.append(len(tokens))
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    def cost_of(self, n_tokens: int) -> float:
        """Nominal seconds to evaluate `n_tokens` in one call."""
        return self.cost_s[0] + self.cost_s[1] * n_tokens

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None, started: float) -> None:
        """Simulated compute time (not synchronisation), polling `abort` as llama.cpp does:
        slept in real time, so that lead and backs overlap, and added to `clock` exactly.
        The call's own Python work since `started` counts towards it: a simulated call
        costs what was asked, not that plus this fake's arithmetic."""
        seconds = self.cost_of(n_tokens)
        end = started + seconds
        while True:
            if abort is not None and abort():
                raise EvaluationAborted()
            left = end - time.perf_counter()
            if left <= 0:
                break
            # The last SPIN_S is spun, not slept (a sleep overshoots by ~0.1 ms, a tenth of
            # a fast simulated draft's call), the GIL given up at every turn: a real
            # model's call holds none.
            if left <= SPIN_S:
                os.sched_yield()
            else:
                time.sleep(min(left - SPIN_S, 0.001) if abort is not None else left - SPIN_S)
        if self.clock is not None:
            self.clock.advance(seconds)

    def truncate(self, n: int) -> None:
        del self.cached[n:]
        self._shared = [min(s, n) for s in self._shared]

    # --- grammars ---
    def constraint(self, gbnf: str) -> FakeGrammar:
        check_gbnf(gbnf)  # as shared/llama/grammar.py does, before the parser
        return FakeGrammar.parse(gbnf, self.tokenize, self.n_vocab)

    def schema_grammar(self, schema: dict[str, Any], strict: bool = True) -> str:
        """A stand-in for JSON (the alphabet has no braces): `name:value` per property;
        ValueError for a schema over a bound (shared/grammar/schema_bounds.py), where `type` is
        no JSON type, or (if `strict`) for `minimum`."""
        if isinstance(schema, dict):
            check_schema(schema)
            check_shapes(schema)
        if not isinstance(schema, dict) or schema.get("type", "object") not in JSON_TYPES:
            raise ValueError(f"unsupported or invalid JSON schema: {schema!r}")
        if strict and "minimum" in schema:
            raise ValueError("schema.minimum is not enforced here")
        names = list(schema.get("properties", {})) or ["value"]
        return "root ::= " + " | ".join(
            '"' + ";".join(f"{n}:{v}" for n in names) + '"' for v in ("1", "22", "yes", "no"))

    # --- reference ---
    def greedy_continuation(self, context: Sequence[int], n: int) -> list[int]:
        """What this model emits alone, greedily (stops after EOS)."""
        out: list[int] = []
        ctx = list(context)
        while len(out) < n:
            token = int(np.argmax(self.logits_for(ctx)))
            out.append(token)
            ctx.append(token)
            if token == EOS:
                break
        return out


def _share(what: tuple[object, ...]) -> float:
    """A fixed pseudo-random number in [0, 1) for `what`."""
    digest = hashlib.blake2b(repr(what).encode(), digest_size=8).digest()
    return int.from_bytes(digest) / 2**64


def _make_second(logits: np.ndarray, token: int) -> None:
    """Raise `token`'s logit to between the first and second likeliest (in place), unless it
    is the first already."""
    order = np.argsort(-logits, kind="stable")
    if order[0] == token or order[1] == token:
        return
    logits[token] = (logits[order[0]] + logits[order[1]]) / 2


JSON_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
_LITERALS = re.compile(r'\s*root\s*::=\s*("(?:[^"\\]|\\.)*"(?:\s*\|\s*"(?:[^"\\]|\\.)*")*)\s*')


class FakeGrammar:
    """A Constraint over the fake vocabulary: the GBNF subset `root ::= "lit" | "lit" ...`
    (a finite language), as a trie of token ids. State: a node; node -1 has ended, and
    allows only EOS. No node is a dead end, so the mask never needs its fallback."""

    def __init__(self, children: list[dict[int, int]], ends: set[int], n_vocab: int,
                 node: int = 0) -> None:
        self.children, self.ends, self.n_vocab, self.node = children, ends, n_vocab, node

    @classmethod
    def parse(cls, gbnf: str, tokenize: Callable[..., list[int]], n_vocab: int) -> FakeGrammar:
        match = _LITERALS.fullmatch(gbnf)
        if match is None:
            raise ValueError("parse error: the fake grammar takes root ::= \"a\" | \"b\" ...")
        children: list[dict[int, int]] = [{}]
        ends: set[int] = set()
        for literal in re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(1)):
            node = 0
            for token in tokenize(literal.replace("\\n", "\n").replace('\\"', '"')):
                if token not in children[node]:
                    children[node][token] = len(children)
                    children.append({})
                node = children[node][token]
            ends.add(node)
        return cls(children, ends, n_vocab)

    def _next(self) -> list[int]:
        if self.node < 0:
            return [EOS]
        return [*self.children[self.node], *([EOS] if self.node in self.ends else [])]

    def allows(self, token_id: int) -> bool:
        return token_id in self._next()

    def mask(self, row: np.ndarray) -> np.ndarray:
        out = np.full_like(row, -np.inf)
        allowed = self._next() or [EOS]  # nothing allowed: end the reply
        out[allowed] = row[allowed]
        return out

    def advanced(self, tokens: Sequence[int]) -> FakeGrammar:
        node = self.node
        for token in tokens:
            if token == EOS:  # always taken: it ends the reply
                node = -1
                continue
            if node < 0 or token not in self.children[node]:
                raise ValueError(f"the grammar does not allow token {token} here")
            node = self.children[node][token]
        return FakeGrammar(self.children, self.ends, self.n_vocab, node)


def _fake_turn(message: dict[str, Any]) -> str:
    calls = "".join(f" calls: {c['function']['name']}({json.dumps(c['function']['arguments'])})"
                    for c in message.get("tool_calls", []))
    return f"{message['role']}: {message['content']}{calls}\n"

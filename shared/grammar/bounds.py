"""Bounds on GBNF grammars, checked before llama.cpp's grammar parser sees them (pure:
lead, backs and the fakes share it; JSON schemas' are in shared/grammar/schema_bounds.py).

llama.cpp's parser recurses once per nested group, and its left-recursion check once per
rule that begins the next, with no limit: too deep and the process dies of a stack
overflow (SIGSEGV, no message). Measured here (llama-cpp-python 0.3.36, SmolLM2's
vocabulary, in a subprocess): parentheses nested 18,600 deep parse on an 8 MiB stack, on
the main thread and on a Python thread alike (threading.stack_size() is 0: the same 8 MiB
default), and 18,750 crash, about 450 bytes a level; a chain of 50,000 rules each
beginning with the next passes the left-recursion check and 70,000 crash (~120 bytes a
rule). MAX_NESTING is 1/70 of the first and MAX_RULES 1/17 of the second: both fit a
1 MiB stack too.

Other grammars stall instead (SmolLM2, 49k tokens; a full mask of a JSON grammar takes
3-15 ms): `x{5,3}` makes llama.cpp generate rules without end (its count wraps around);
each alternative open at one point costs about 0.4 ms a mask (2,048: 0.9 s); a bounded
repetition of something that can be empty, `("a"?){0,100}`, costs 1.4 s a mask,
`("a"*){0,100}` 2.8 s, two such levels 2-13 s. Not bounded here (no cheap check tells
them from real grammars): ambiguity that grows with the text, e.g. `x{1,10}` nested four
rules deep (1.2 s a mask after 20 tokens), and alternatives that share a prefix before a
wide rule, e.g. 40 alternatives `"p" x "i"` over an x of 1,000 (4.8 s a mask after "p").
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

MAX_GBNF_BYTES = 256 * 1024  # lead's request body is at most 1 MiB by default
MAX_NESTING = 256  # parentheses inside parentheses
MAX_RULES = 4096  # rules, groups and repetitions: links of the left-recursion check's chain
MAX_REPEAT = 2000  # llama.cpp's MAX_REPETITION_THRESHOLD: over it {m,n} errs or loses n
MAX_ELEMENTS = 1 << 20  # symbols after llama.cpp copies repeated items (8 bytes each)
MAX_CHOICES = 1024  # alternatives open at one point: each is a stack every mask checks

_TOKENS = re.compile(r"""
    (?P<space>[ \t\r\n]+|\#[^\r\n]*)
  | (?P<literal>"(?:[^"\\]|\\.)*")
  | (?P<klass>\[(?:[^\]\\]|\\.)*\])
  | (?P<token>!?<[^>]*>)
  | (?P<define>::=)
  | (?P<name>[A-Za-z0-9_-]+)
  | (?P<op>[()|*+?.{},])
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)
_COUNTS = {"?": (0, 1), "*": (0, None), "+": (1, None)}
_Count = tuple[int, int | None]  # (min, max or None for no maximum)
_Token = tuple[str, str]  # (kind, text)


@dataclass
class _Item:
    """One symbol of a sequence: a terminal, a rule's name or a group (then `node`)."""

    size: int  # elements it writes into a rule
    name: str | None = None
    node: int = -1  # the node a name or group refers to; -1: none (or an undefined name)
    empty: bool = False  # the empty literal ""
    counts: list[_Count] = field(default_factory=list)


@dataclass
class _Node:
    """A named rule or a group: its alternatives, each a sequence of items."""

    alts: list[list[_Item]] = field(default_factory=lambda: [[]])


class _Shape:
    """The structure of a GBNF text as llama.cpp's parser builds it, for counting."""

    def __init__(self) -> None:
        self.nodes: list[_Node] = []
        self.names: dict[str, int] = {}
        self.open: list[_Node] = []  # the rule being read, then the groups open in it
        self.rules = 0  # rules, groups and repetitions

    def add(self, item: _Item) -> None:
        if self.open:
            self.open[-1].alts[-1].append(item)

    def start(self, name: str | None) -> None:
        """A rule (`name`) or a group begins."""
        self.nodes.append(_Node())
        self.rules += 1
        if name is None:
            self.add(_Item(1, node=len(self.nodes) - 1))
            self.open.append(self.nodes[-1])
        else:
            self.names[name] = len(self.nodes) - 1
            self.open = [self.nodes[-1]]

    def repeat_last(self, count: _Count) -> None:
        """A repetition applies to the last item (llama.cpp refuses one with none)."""
        sequence = self.open[-1].alts[-1] if self.open else []
        if sequence:
            sequence[-1].counts.append(count)
            self.rules += 1

    def items(self) -> list[_Item]:
        return [item for node in self.nodes for seq in node.alts for item in seq]


def check_gbnf(text: str, what: str = "the grammar") -> None:
    """ValueError naming the construct and the limit where `text` is over a bound, its
    message starting with `what`."""
    refusal = _refusal(text)
    if refusal is not None:
        raise ValueError(what + refusal)


@functools.lru_cache(maxsize=32)
def _refusal(text: str) -> str | None:
    """Why `text` is refused, after the words naming it (None: it is not). Kept for the
    texts seen last: lead checks a request's grammar, then parses it, and clients send
    the same schema again and again (a 256 KiB grammar takes up to 0.3 s to check)."""
    try:
        _check(text)
    except ValueError as exc:
        return str(exc)
    return None


def _check(text: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_GBNF_BYTES:
        raise ValueError(f" is {size} bytes, over the limit of {MAX_GBNF_BYTES}")
    tokens = [(m.lastgroup or "", m.group()) for m in _TOKENS.finditer(text)
              if m.lastgroup != "space"]
    deepest = _nesting(tokens)
    if deepest > MAX_NESTING:
        raise ValueError(f": parentheses nest {deepest} deep, over the limit of {MAX_NESTING}")
    shape = _read(tokens)
    items = shape.items()
    _check_totals(shape, items)
    nullable = _nullable(shape)
    _check_repeats(items, nullable)
    _check_choices(shape, nullable)


def _nesting(tokens: list[_Token]) -> int:
    depth = deepest = 0
    for kind, value in tokens:
        if kind == "op" and value in "()":
            depth = depth + 1 if value == "(" else max(depth - 1, 0)
            deepest = max(deepest, depth)
    return deepest


def _read(tokens: list[_Token]) -> _Shape:
    """Tokens as llama.cpp reads them (_TOKENS: what is inside a literal, a character
    class, a token or a comment is never a parenthesis or a repetition)."""
    shape = _Shape()
    i = 0
    while i < len(tokens):
        kind, value = tokens[i]
        if kind == "name" and tokens[i + 1:i + 2] == [("define", "::=")]:
            shape.start(value)
            i += 1
        elif value == "{" and (count := _count_at(tokens, i)) is not None:
            _check_count(count[0])
            shape.repeat_last(count[0])
            i += count[1]
        else:
            _read_one(shape, kind, value)
        i += 1
    for item in shape.items():
        if item.name is not None:
            item.node = shape.names.get(item.name, -1)
    return shape


def _read_one(shape: _Shape, kind: str, value: str) -> None:
    if kind == "name":
        shape.add(_Item(1, value))
    elif kind in ("literal", "klass"):
        shape.add(_Item(len(value) - 2, empty=value == '""'))
    elif kind == "token" or value == ".":
        shape.add(_Item(1))
    elif kind != "op":
        return
    elif value == "(":
        shape.start(None)
    elif value == ")" and len(shape.open) > 1:
        shape.open.pop()
    elif value == "|" and shape.open:
        shape.open[-1].alts.append([])
    elif value in _COUNTS:
        shape.repeat_last(_COUNTS[value])


def _count_at(tokens: list[_Token], i: int) -> tuple[_Count, int] | None:
    """`{m}`, `{m,}` or `{m,n}` at tokens[i], as llama.cpp reads it, and the tokens it
    takes after the brace; None where llama.cpp will refuse it."""
    words = [value for _, value in tokens[i + 1:i + 5]] + ["", "", "", ""]
    if not words[0].isdigit():
        return None
    low = int(words[0])
    if words[1] == "}":
        return (low, low), 2
    if words[1:3] == [",", "}"]:
        return (low, None), 3
    if words[1] == "," and words[2].isdigit() and words[3] == "}":
        return (low, int(words[2])), 4
    return None


def _check_count(count: _Count) -> None:
    low, high = count
    for bound in (low, high):
        if bound is not None and bound > MAX_REPEAT:
            raise ValueError(f": the repetition {_shown(count)}: {bound} is over the limit "
                             f"of {MAX_REPEAT}")
    if high is not None and low > high:  # llama.cpp's count of rules to make wraps around
        raise ValueError(f": the repetition {_shown(count)} has its minimum over its "
                         "maximum")


def _shown(count: _Count) -> str:
    low, high = count
    return f"{{{low}}}" if high == low else f"{{{low},{'' if high is None else high}}}"


def _check_totals(shape: _Shape, items: list[_Item]) -> None:
    if shape.rules > MAX_RULES:
        raise ValueError(f" has {shape.rules} rules, groups and repetitions, over the limit "
                         f"of {MAX_RULES}")
    elements = sum(_elements(item) for item in items)
    if elements > MAX_ELEMENTS:
        raise ValueError(f" expands to about {elements} symbols once its repetitions are "
                         f"written out, over the limit of {MAX_ELEMENTS}")


def _elements(item: _Item) -> int:
    """llama.cpp writes x{m,n} as m copies of x and n - m rules holding one each."""
    copies, rules = 1, 0
    for low, high in item.counts:
        copies *= max(low, high or 0, 1)
        rules += 1 if high is None else high - low
    return max(item.size, 1) * copies + 4 * rules


def _empty_alone(item: _Item) -> bool:
    """Empty whatever a name in it means: "", or repeated from zero times."""
    return item.empty or any(low == 0 for low, _ in item.counts)


def _nullable(shape: _Shape) -> list[bool]:
    """Which nodes can match the empty string: a worklist, linear in the grammar's size."""
    nullable = [False] * len(shape.nodes)
    waiting: dict[int, list[list[int]]] = {}  # node -> [items left, node] of sequences
    ready: list[int] = []
    for index, node in enumerate(shape.nodes):
        for seq in node.alts:
            left = [0, index]
            for item in seq:
                if _empty_alone(item):
                    continue
                left[0] += 1 if item.node >= 0 else len(seq) + 1  # a terminal: never
                if item.node >= 0:
                    waiting.setdefault(item.node, []).append(left)
            if left[0] == 0:
                ready.append(index)
    while ready:
        index = ready.pop()
        for left in waiting.pop(index, []) if not nullable[index] else []:
            left[0] -= 1
            if left[0] == 0:
                ready.append(left[1])
        nullable[index] = True
    return nullable


def _item_nullable(item: _Item, nullable: list[bool]) -> bool:
    return _empty_alone(item) or (item.node >= 0 and nullable[item.node])


def _check_repeats(items: list[_Item], nullable: list[bool]) -> None:
    """x{m,n} over an x that can be empty: any number of empties fits anywhere, and
    llama.cpp follows every way (seconds a token, see above)."""
    for item in (item for item in items if item.counts):
        empty = item.empty or (item.node >= 0 and nullable[item.node])
        for low, high in item.counts:
            if empty and max(low, high or 0) >= 2:
                raise ValueError(f": the repetition {_shown((low, high))} repeats something "
                                 "that can be empty, which llama.cpp follows very slowly; "
                                 "make what it repeats non-empty")
            empty = empty or low == 0


def _check_choices(shape: _Shape, nullable: list[bool]) -> None:
    """The alternatives open at the start of each rule or group, through the rules that
    begin it: llama.cpp keeps a stack for each and checks every token against each."""
    if max(_choices(shape, nullable), default=0) > MAX_CHOICES:
        raise ValueError(f" opens more than {MAX_CHOICES} alternatives at one point, over "
                         f"the limit of {MAX_CHOICES} (llama.cpp checks every token against "
                         "each)")


def _leading(seq: list[_Item], nullable: list[bool]) -> list[_Item]:
    """The items a sequence may begin with: up to its first that cannot be empty."""
    out = []
    for item in seq:
        out.append(item)
        if not _item_nullable(item, nullable):
            break
    return out


def _choices(shape: _Shape, nullable: list[bool]) -> list[int]:
    """Per node, its open alternatives (saturated just over the limit), depth first
    without recursion: a chain of rules may be MAX_RULES long; a loop counts 1."""
    value = [-1] * len(shape.nodes)  # -1: not seen, -2: in progress
    for start in range(len(shape.nodes)):
        stack = [start]
        while stack:
            index = stack[-1]
            if value[index] == -1:
                value[index] = -2
                stack += [item.node for seq in shape.nodes[index].alts
                          for item in _leading(seq, nullable)
                          if item.node >= 0 and value[item.node] == -1]
            else:
                if value[index] == -2:
                    value[index] = _sum_choices(shape.nodes[index], nullable, value)
                stack.pop()
    return value


def _sum_choices(node: _Node, nullable: list[bool], value: list[int]) -> int:
    total = 0
    for seq in node.alts:
        leading = _leading(seq, nullable)
        total += sum(max(value[item.node], 1) if item.node >= 0 else 1 for item in leading)
        if not leading or _item_nullable(leading[-1], nullable):
            total += 1  # it can end here: the stack goes on after the rule
    return min(total, MAX_CHOICES + 1)

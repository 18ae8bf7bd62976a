"""Structured output under speculation, with the fake target and the fake grammar (a trie
over the fake vocabulary): greedy output with any drafts equals constrained decoding
without drafts; the API serves json_object, json_schema and grammar, and refuses bad ones
with a 400 naming the field; a back drafts under the grammar. Exactness at temperature > 0:
tests/test_sampling_exact.py. Real grammars and schemas: tests/test_grammar_real.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings
from hypothesis import strategies as st

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.track import Track
from back.worker import Worker
from bench.fake import EOS, FakeGrammar, FakeModel, VirtualClock
from lead.decode.verify import verify
from lead.server.app import create_app
from shared.grammar.constraint import Constraint, best
from shared.wire.httpclient import sse_events
from shared.wire.protocol import SamplingParams, State
from tests.conftest import InProcessLead, async_wait_until, chat_body, make_settings

GREEDY = SamplingParams()
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def literals(seed: int, n: int = 40, length: tuple[int, int] = (6, 24)) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = list("abcdefgh ")
    return ["".join(rng.choice(letters, rng.integers(*length))) for _ in range(n)]


def gbnf(words: list[str]) -> str:
    return "root ::= " + " | ".join(f'"{w}"' for w in words)


TARGET = FakeModel()
ROOT = TARGET.constraint(gbnf(literals(1)))


def reference(prompt: list[int], state: Constraint, n: int = 100) -> list[int]:
    """Constrained greedy decoding without drafts: each row masked whole (no shortcut)."""
    out: list[int] = []
    while len(out) < n and (not out or out[-1] != EOS):
        token = int(np.argmax(state.mask(TARGET.logits_for(prompt + out))))
        state = state.advanced([token])
        out.append(token)
    return out


def speculate(prompt: list[int], propose: Callable[[list[int], Constraint], list[int]],
              n: int = 100) -> tuple[list[int], int]:
    """Drive verify() as lead does, the grammar's state carried from verdict to verdict;
    the output and the number of draft tokens rejected."""
    out: list[int] = []
    state: Constraint = ROOT
    rejected = 0
    rng = np.random.default_rng(0)
    while len(out) < n and (not out or out[-1] != EOS):
        context = prompt + out
        draft = propose(context, state)
        rows = np.stack([TARGET.logits_for(context + draft[:i]) for i in range(len(draft) + 1)])
        verdict = verify(draft, rows, GREEDY, rng, constraint=state)
        assert verdict.accepted == draft[: len(verdict.accepted)]
        assert verdict.constraint is not None
        rejected += len(draft) - len(verdict.accepted)
        state = verdict.constraint
        out += verdict.emitted
    return out[: out.index(EOS) + 1] if EOS in out else out, rejected  # lead ends at an EOS


PROMPT = [5, 6, 7]


def oracle(k: int) -> Callable[[list[int], Constraint], list[int]]:
    return lambda ctx, state: reference(ctx, state, k)


def test_the_grammar_changes_the_output_and_the_reply_ends_with_eos() -> None:
    alone = reference(PROMPT, ROOT)
    free = TARGET.greedy_continuation(PROMPT, len(alone))
    assert alone != free  # the test has power: the mask matters
    assert alone[-1] == EOS and len(alone) < 30
    text = "".join(TARGET.token_bytes(t).decode() for t in alone[:-1])
    assert text in literals(1)


@pytest.mark.parametrize("kind", ["correct", "partly wrong", "random", "grammar-breaking"])
def test_output_with_drafts_equals_constrained_output_without(kind: str) -> None:
    rng = np.random.default_rng(3)

    def propose(ctx: list[int], state: Constraint) -> list[int]:
        good = reference(ctx, state, 5)
        if kind == "correct":
            return good
        if kind == "partly wrong":
            return good[:2] + [(t + 1) % TARGET.n_vocab for t in good[2:]]
        if kind == "random":
            return rng.integers(0, TARGET.n_vocab, size=4).tolist()
        return TARGET.greedy_continuation(ctx, 4)  # blind to the grammar

    out, rejected = speculate(PROMPT, propose)
    assert out == reference(PROMPT, ROOT)
    if kind != "correct":
        assert rejected > 0
    else:
        assert rejected == 0


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), lengths=st.lists(st.integers(0, 6), min_size=1,
                                                        max_size=20))
def test_random_drafts_never_change_constrained_output(seed: int, lengths: list[int]) -> None:
    rng = np.random.default_rng(seed)
    calls = iter(lengths * 10)

    def propose(ctx: list[int], state: Constraint) -> list[int]:
        truth = reference(ctx, state, next(calls, 0))
        noise = rng.integers(0, TARGET.n_vocab, size=len(truth)).tolist()
        flip = rng.random(len(truth)) < 0.3
        return [n if f else t for t, n, f in zip(truth, noise, flip, strict=True)]

    assert speculate(PROMPT, propose)[0] == reference(PROMPT, ROOT)


class Counted(FakeGrammar):
    masks = 0

    def mask(self, row: np.ndarray) -> np.ndarray:
        Counted.masks += 1
        return super().mask(row)


@pytest.mark.parametrize("look", [0, 2, 32, 95])
def test_greedy_is_the_masked_argmax_and_masks_only_where_shortcuts_fail(look: int) -> None:
    rng = np.random.default_rng(5)
    states = [Counted(ROOT.children, ROOT.ends, ROOT.n_vocab, ROOT.advanced(w[:i]).node)
              for w in (TARGET.tokenize(w) for w in literals(1)[:10]) for i in range(3)]
    refused = Counted.masks = 0
    for i in range(300):
        row = rng.normal(size=TARGET.n_vocab).astype(np.float32)
        if i % 3 == 0:  # ties, where np.argmax takes the lowest id
            row = np.round(row)
        state = states[i % len(states)]
        refused += not state.allows(int(np.argmax(row)))
        expected = int(np.argmax(state.mask(row)))
        assert best(row, state, look) == expected
    assert 0 < refused < 300
    masks = Counted.masks - 300  # the reference's own
    assert masks == refused if look == 0 else masks <= refused
    if look >= 32:
        assert masks < refused / 2


def test_a_dead_end_lets_only_the_end_through_and_the_end_is_always_taken() -> None:
    ended = ROOT.advanced([EOS])
    row = np.arange(TARGET.n_vocab, dtype=np.float32)
    assert best(row, ended) == EOS and np.isfinite(ended.mask(row)).sum() == 1
    assert ended.advanced([EOS]).allows(EOS)
    with pytest.raises(ValueError):
        ROOT.advanced([TARGET.tokenize("z")[0]])


def test_a_track_follows_a_sequence_cut_back_and_regrown() -> None:
    start = 3
    words = literals(1)
    seq = [9, 9, 9, *TARGET.tokenize(words[0])]
    track = Track(ROOT, start)
    track.KEEP = 2  # cut deeper than what is kept: replayed from the start
    for n in (len(seq), 5, len(seq), 4, len(seq)):
        state = track.at(seq[:n])
        assert state is not None
        assert state.node == ROOT.advanced(seq[start:n]).node  # type: ignore[attr-defined]
    assert track.at([*seq[:start], *TARGET.tokenize("zz")]) is None


def test_a_grammar_that_does_not_parse_is_a_value_error() -> None:
    for bad in ("root ::= (", "", 'root ::= "a" |', "start ::= \"a\""):
        with pytest.raises(ValueError):
            TARGET.constraint(bad)


# --- the API, over the fake target ---

YES_NO = 'root ::= "yes" | "no" | "maybe so"'
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


@pytest.fixture(scope="module")
def client() -> TestClient:
    return TestClient(create_app(make_settings(max_tokens=64), FakeModel(eos_bias=-100.0)))


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"  # the grammar ended it, not max_tokens
    return choice["message"]["content"] if "message" in choice else choice["text"]


def fake_json(schema: dict) -> set[str]:
    """The replies the fake's stand-in for a schema's grammar allows."""
    alternatives = FakeModel().schema_grammar(schema).removeprefix("root ::= ")
    return set(json.loads("[" + alternatives.replace(" | ", ",") + "]"))


def test_grammar_json_object_and_json_schema_are_served(client: TestClient) -> None:
    assert content(client.post(CHAT, json=chat_body(grammar=YES_NO))) in \
        {"yes", "no", "maybe so"}
    assert content(client.post(COMPLETIONS, json={"prompt": "ab", "grammar": YES_NO})) in \
        {"yes", "no", "maybe so"}
    reply = content(client.post(CHAT, json=chat_body(
        response_format={"type": "json_object"})))
    assert reply in fake_json({"type": "object"})
    reply = content(client.post(CHAT, json=chat_body(response_format={
        "type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}})))
    assert reply in fake_json(SCHEMA) and reply.startswith("n:")


def test_a_constrained_stream_is_the_plain_reply_in_pieces(client: TestClient) -> None:
    body = chat_body(grammar=gbnf(literals(2)), max_tokens=60)
    whole = content(client.post(CHAT, json=body))
    with client.stream("POST", CHAT, json={**body, "stream": True}) as r:
        events = list(sse_events(r))
    pieces = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert pieces == whole and whole in literals(2)
    assert events[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(("fields", "param"), [
    ({"grammar": "root ::= ("}, "grammar"),
    ({"grammar": 'start ::= "a"'}, "grammar"),
    ({"grammar": YES_NO, "response_format": {"type": "json_object"}}, "grammar"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no such type"}}}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": []}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {  # not enforced: refused
        "schema": {"type": "integer", "minimum": 1}}}}, "response_format"),
])
def test_a_bad_grammar_or_schema_is_a_400_naming_the_field(client: TestClient, fields: dict,
                                                           param: str) -> None:
    r = client.post(CHAT, json=chat_body(**fields))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and \
        r.json()["error"]["message"].startswith(param), r.text


def test_strict_false_lets_through_a_keyword_the_grammar_cannot_enforce(
        client: TestClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {
        "name": "n", "strict": False, "schema": {"type": "integer", "minimum": 1}}}
    assert content(client.post(CHAT, json=chat_body(response_format=fmt)))


def test_text_and_an_empty_grammar_are_a_free_reply(client: TestClient) -> None:
    free = client.post(CHAT, json=chat_body(max_tokens=8)).json()
    for fields in ({"response_format": {"type": "text"}}, {"grammar": ""}):
        r = client.post(CHAT, json=chat_body(max_tokens=8, **fields))
        assert r.json()["choices"] == free["choices"]


def test_the_grammar_reaches_backs_beside_sampling_where_old_backs_ignore_it() -> None:
    state = State(sampling=SamplingParams(grammar=YES_NO))
    wire = json.loads(state.model_dump_json())
    assert wire["grammar"] == YES_NO and "grammar" not in wire["sampling"]
    assert State.model_validate(wire).sampling.grammar == YES_NO
    # a back that predates the field reads `sampling` with extra fields forbidden
    SamplingParams.model_validate(wire["sampling"])


# --- lead and a back in one process ---

def test_a_back_drafts_under_the_grammar_and_output_equals_lead_alone() -> None:
    grammar = gbnf(literals(4, n=30, length=(40, 70)))

    async def ask(transport: httpx.AsyncBaseTransport) -> dict:
        async with httpx.AsyncClient(transport=transport, base_url="http://lead") as http:
            r = await http.post(CHAT, json=chat_body(grammar=grammar, max_tokens=100))
            assert r.status_code == 200, r.text
            return r.json()

    def lead() -> InProcessLead:
        target = FakeModel(cost_s=(0.003, 0.0005), eos_bias=-100.0)
        settings = make_settings(max_tokens=100, draft_len=4)  # drafts verified, even blind
        return InProcessLead(create_app(settings, target))

    async def helped_by(transport: InProcessLead, drafter: ModelDrafter) -> dict:
        draft = drafter.model
        worker = Worker(LeadClient("http://lead", transport=transport),
                        drafter, draft.fingerprint(), draft.n_vocab, back_id="m")
        task = asyncio.create_task(worker.run())
        try:
            await async_wait_until(lambda: worker.version >= 0, what="handshake")
            return await ask(transport)
        finally:
            worker.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def body() -> None:
        alone = await ask(lead())
        for blind in (False, True):
            draft = FakeModel(salt="draft", agree=0.8, cost_s=(0.0005, 0.0))
            drafter = ModelDrafter(draft, blind=blind)
            async with lead() as transport:
                helped = await helped_by(transport, drafter)
            assert helped["choices"] == alone["choices"], blind
            assert helped["usage"]["drafted_tokens"] > 0
            if not blind:
                assert helped["usage"]["accepted_tokens"] > 0
                assert drafter.grammars.followed is not None  # it drafted under the grammar
            else:
                assert drafter.grammars.followed is None

    asyncio.run(asyncio.wait_for(body(), 60))


# --- a grammar that costs seconds a token ends its reply ---


class SlowGrammar:
    """The fake grammar with every check costing `cost_s` on the virtual clock, as an
    ambiguous real grammar's masks can cost seconds a row."""

    def __init__(self, inner: FakeGrammar, clock: VirtualClock, cost_s: float) -> None:
        self.inner, self.clock, self.cost_s = inner, clock, cost_s

    def allows(self, token_id: int) -> bool:
        self.clock.advance(self.cost_s)
        return self.inner.allows(token_id)

    def mask(self, row: np.ndarray) -> np.ndarray:
        self.clock.advance(self.cost_s)
        return self.inner.mask(row)

    def advanced(self, tokens: list[int]) -> SlowGrammar:
        return SlowGrammar(self.inner.advanced(tokens), self.clock, self.cost_s)


class SlowGrammarModel(FakeModel):
    def __init__(self, cost_s: float) -> None:
        super().__init__(eos_bias=-100.0, clock=VirtualClock())
        self.check_s = cost_s

    def constraint(self, gbnf: str) -> SlowGrammar:  # type: ignore[override]
        assert self.clock is not None
        return SlowGrammar(super().constraint(gbnf), self.clock, self.check_s)


@pytest.mark.parametrize(("check_s", "finish"), [(0.002, "stop"), (0.6, "length")])
def test_a_grammar_over_its_time_a_token_ends_the_reply(
        check_s: float, finish: str, caplog: pytest.LogCaptureFixture) -> None:
    model = SlowGrammarModel(check_s)
    app = create_app(make_settings(max_grammar_s=1.0, calibrate=False), model,
                     clock=model.clock)  # type: ignore[arg-type]
    with TestClient(app) as client:
        r = client.post(CHAT, json=chat_body(grammar=gbnf(literals(2)), max_tokens=60))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == finish, r.text
    warned = [m.getMessage() for m in caplog.records if "a token to apply" in m.getMessage()]
    if finish == "length":  # two checks a token at the least: 1.2 s, over the 1 s allowed
        assert r.json()["usage"]["completion_tokens"] == 1 and len(warned) == 1, warned
    else:
        assert choice["message"]["content"] in literals(2) and not warned

"""llama-server's token probabilities on /completion (`n_probs`, `post_sampling_probs`;
lead/apis/tokenprobs.py), in process over the fake model: an entry a token, whole and
streamed alike; after sampling, read from the distribution the token was drawn from (the
same with drafts as without); bad values a 400."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from fastapi.testclient import TestClient

from bench.fake import ALPHABET, EOS, FakeModel
from lead.apis.tokenprobs import LOWEST, piece_text, probabilities, token_objects
from lead.backs.feed import attach
from lead.decode.engine import Engine, GenRequest
from lead.server.app import create_app
from shared.logprobs import TokenLogprob
from shared.penalties import adjust
from shared.sampling import distribution
from shared.wire.protocol import SamplingParams
from tests.conftest import make_settings
from tests.test_api import scripted_client

PROMPT = "hello there"
KEYS = {"id", "token", "bytes", "logprob", "top_logprobs"}
POST_KEYS = {"id", "token", "bytes", "prob", "top_probs"}


def client() -> TestClient:
    return TestClient(create_app(make_settings(), FakeModel()))


def whole(c: TestClient, **body: object) -> dict:
    r = c.post("/completion", json={"prompt": PROMPT, "n_predict": 10, **body})
    assert r.status_code == 200, r.text
    return r.json()


def streamed(c: TestClient, **body: object) -> list[dict]:
    with c.stream("POST", "/completion", json={"prompt": PROMPT, "n_predict": 10,
                                                "stream": True, **body}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


# --- whole and streamed ---

def test_each_token_gets_its_logprob_and_the_n_likeliest() -> None:
    c = client()
    reply = whole(c, n_probs=4, return_tokens=True)
    entries = reply["completion_probabilities"]
    assert [e["id"] for e in entries] == reply["tokens"] and len(entries) == 10
    for e in entries:
        assert set(e) == KEYS and e["logprob"] <= 0 and len(e["top_logprobs"]) == 4
        assert bytes(e["bytes"]).decode() == e["token"]
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and e["logprob"] >= tops[-1]
    assert "".join(e["token"] for e in entries) == reply["content"]
    assert reply["generation_settings"]["n_probs"] == 4
    # the same numbers OpenAI's completions give for the same generation
    openai = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 10,
                                             "logprobs": 4}).json()["choices"][0]["logprobs"]
    assert [e["logprob"] for e in entries] == openai["token_logprobs"]
    assert "completion_probabilities" not in whole(c)


@pytest.mark.parametrize("post", [False, True])
def test_streamed_an_object_a_token_each_with_its_entry_as_the_whole_reply(post: bool) -> None:
    c = client()
    body = {"n_probs": 3, "post_sampling_probs": post, "temperature": 0.9, "seed": 4}
    reply = whole(c, **body)
    events = streamed(c, **body)
    pieces, last = events[:-1], events[-1]
    assert all(len(e["tokens"]) == 1 and len(e["completion_probabilities"]) == 1
               for e in pieces)
    assert [x for e in pieces for x in e["completion_probabilities"]] == \
        reply["completion_probabilities"]
    assert [e["completion_probabilities"][0]["id"] for e in pieces] == \
        [t for e in pieces for t in e["tokens"]]
    assert "".join(e["content"] for e in events) == reply["content"]
    assert last["stop"] is True and "completion_probabilities" not in last


def test_response_fields_pick_the_probabilities_as_any_field() -> None:
    c = client()
    reply = whole(c, n_probs=2, response_fields=["content"])
    assert set(reply) == {"content"}
    reply = whole(c, n_probs=2, response_fields=["content", "completion_probabilities"])
    assert set(reply) == {"content", "completion_probabilities"}


def test_the_end_of_text_token_streams_without_an_entry() -> None:
    c, model = scripted_client("ok")
    model.prompt_len = len(model.tokenize("hi"))
    r = c.post("/completion", json={"prompt": "hi", "n_probs": 2, "return_tokens": True})
    body = r.json()
    assert body["tokens"][-1] == EOS and body["stop_type"] == "eos"
    assert [e["id"] for e in body["completion_probabilities"]] == body["tokens"][:-1]
    with c.stream("POST", "/completion", json={"prompt": "hi", "n_probs": 2,
                                               "stream": True}) as s:
        events = [json.loads(x[6:]) for x in s.iter_lines() if x.startswith("data: ")]
    assert [len(e.get("completion_probabilities", [])) for e in events[:-1]] == [1, 1, 0]


# --- after sampling: the distribution sampled ---

@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 1.0, "top_k": 1}])
def test_a_greedy_token_has_probability_one_and_is_its_only_candidate(sampling: dict) -> None:
    reply = whole(client(), n_probs=5, post_sampling_probs=True, **sampling)
    for e in reply["completion_probabilities"]:
        assert set(e) == POST_KEYS and e["prob"] == 1.0
        assert [(t["id"], t["prob"]) for t in e["top_probs"]] == [(e["id"], 1.0)]


def test_post_sampling_probs_are_the_truncated_distributions() -> None:
    model = FakeModel()
    c = TestClient(create_app(make_settings(), model))
    sampling = {"temperature": 0.7, "top_k": 6, "top_p": 0.9, "seed": 11}
    reply = whole(c, n_probs=10, post_sampling_probs=True, return_tokens=True, **sampling)
    params = SamplingParams(**sampling)
    context = model.tokenize(PROMPT, special=True)
    for e, token in zip(reply["completion_probabilities"], reply["tokens"], strict=True):
        dist = distribution(adjust(model.logits_for(context), params, context, 0), params)
        assert e["id"] == token and e["prob"] == pytest.approx(dist.prob_of(token))
        assert 0 < e["prob"] <= 1 and 1 <= len(e["top_probs"]) <= 6  # top_k cuts the ten
        assert [t["id"] for t in e["top_probs"]] == dist.token_ids.tolist()
        assert sum(t["prob"] for t in e["top_probs"]) == pytest.approx(1.0)
        context.append(token)


async def engine_entries(params: SamplingParams, reference: list[int] | None = None,
                         grammar: str | None = None) -> tuple[list[int], list[TokenLogprob]]:
    """Post-sampling entries straight from the engine; with `reference`, a back posts it
    as drafts."""
    model = FakeModel(eos_bias=-100.0)
    engine = Engine(model, max_draft=8, draft_len=6)
    feed = attach(engine)
    if grammar is not None:
        params = params.model_copy(update={"grammar": grammar})
    request = GenRequest([5, 6, 7], 30, params, top_logprobs=4, post_sampling=True,
                         constraint=model.constraint(grammar) if grammar else None)
    entries: list[TokenLogprob] = []
    async for e in engine.generate(request):
        entries += e.logprobs
        s = engine.session
        if reference and s is not None and not s.done:
            feed.post_draft(s.id, len(s.tokens), reference[s.n_generated:][:7], None, "b")
    s = engine.session
    assert s is not None and (reference is None or s.accepted > 0)
    return s.tokens[3:], entries


def test_post_sampling_entries_with_drafts_equal_entries_without() -> None:
    params = SamplingParams(temperature=0.8, top_p=0.95, seed=3)
    tokens, alone = asyncio.run(engine_entries(params))
    assert asyncio.run(engine_entries(params, tokens)) == (tokens, alone)
    assert all(0 < math.exp(e.logprob) <= 1 for e in alone)


def test_under_a_grammar_only_what_it_allows_has_a_probability() -> None:
    def allowed(text: str) -> set[int]:
        return {ALPHABET.index(ch) + 1 for ch in text}
    _, entries = asyncio.run(engine_entries(SamplingParams(temperature=1.0, seed=1),
                                            grammar='root ::= "abc" | "abd" | "xyz"'))
    assert {i for i, _ in entries[0].top} == allowed("ax")
    assert sum(math.exp(lp) for _, lp in entries[0].top) == pytest.approx(1.0)
    assert len(entries[2].top) in (1, 2)  # after "ab": c or d; after "xy": z


# --- the shapes, pure ---

def test_a_character_split_across_tokens_and_a_zero_probability() -> None:
    entry = TokenLogprob(7, -math.inf, ((7, -math.inf),))
    out = probabilities([entry], lambda _: b"\xc3", post_sampling=False)[0]
    assert out["token"] == "" and out["bytes"] == [0xC3] and out["logprob"] == LOWEST
    assert out["top_logprobs"][0]["logprob"] == LOWEST
    assert piece_text(b"a\xc3\xa9") == "a\u00e9" and piece_text(b"\xff") == "\ufffd"


def test_a_pieces_text_goes_on_its_last_token() -> None:
    entries = [TokenLogprob(3, -0.5, ()), TokenLogprob(4, -0.25, ())]
    objects = token_objects("cd", [3, 4, EOS], entries, lambda t: b"x", post_sampling=True)
    assert [o["content"] for o in objects] == ["", "", "cd"]
    assert [o["completion_probabilities"][0]["prob"] for o in objects[:2]] == \
        pytest.approx([math.exp(-0.5), math.exp(-0.25)])
    assert "completion_probabilities" not in objects[2]
    assert token_objects("z", [], [], lambda t: b"", False)[0]["tokens"] == []


@pytest.mark.parametrize("body", [{"n_probs": -1}, {"n_probs": 21}, {"n_probs": "ten"},
                                  {"n_probs": 2, "post_sampling_probs": "maybe"}])
def test_bad_values_are_a_400_naming_the_field_and_lead_keeps_serving(body: dict) -> None:
    c = client()
    r = c.post("/completion", json={"prompt": "a", **body})
    field = next(iter(body)) if "post_sampling_probs" not in body else "post_sampling_probs"
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    assert field in r.json()["error"]["message"]
    assert whole(c, n_probs=1)["completion_probabilities"]


def test_infill_serves_them_as_completion_does() -> None:
    c = TestClient(create_app(make_settings(), FakeModel(fim=True)))
    body = {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 6, "n_probs": 3,
            "return_tokens": True}
    reply = c.post("/infill", json=body).json()
    entries = reply["completion_probabilities"]
    assert [e["id"] for e in entries] == reply["tokens"] and len(entries) == 6
    assert all(set(e) == KEYS and len(e["top_logprobs"]) == 3 for e in entries)
    assert "".join(e["token"] for e in entries) == reply["content"]
    with c.stream("POST", "/infill", json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert [e["completion_probabilities"][0] for e in events[:-1]] == entries
    bad = c.post("/infill", json={"input_prefix": "a", "n_probs": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "n_probs"

"""Fill in the middle: /v1/completions with a suffix, and /infill as llama.vim and
llama.vscode send it to llama.cpp's server (their request bodies copied from their sources)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel, VirtualClock
from lead.server.app import create_app
from shared.wire.httpclient import sse_events
from tests.conftest import make_settings


def completion(model: FakeModel, **fields: object) -> tuple[int, dict]:
    client = TestClient(create_app(make_settings(max_tokens=4), model))
    r = client.post("/v1/completions", json={"max_tokens": 3, "temperature": 0, **fields})
    return r.status_code, r.json()


def test_a_suffix_asks_for_the_middle_in_the_models_own_format() -> None:
    model = FakeModel(fim=True)
    status, body = completion(model, prompt="def f(", suffix="):\n")
    assert status == 200, body
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    prompt = [pre, *model.tokenize("def f(", add_bos=False), suf,
              *model.tokenize("):\n", add_bos=False), mid]
    assert model.cached[:len(prompt)] == prompt  # what the reply was decoded after
    assert body["usage"]["prompt_tokens"] == len(prompt) == 3 + 6 + 3
    assert body["usage"]["completion_tokens"] == 3 and body["choices"][0]["text"]


def test_the_middle_is_what_the_model_says_after_its_middle_marker() -> None:
    model = FakeModel(fim=True)
    _, body = completion(model, prompt="ab", suffix="cd")
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    expected = model.greedy_continuation([pre, *model.tokenize("ab"), suf,
                                          *model.tokenize("cd"), mid], 3)
    assert body["choices"][0]["text"] == "".join(model.token_bytes(t).decode()
                                                 for t in expected)


@pytest.mark.parametrize("suffix", ["", None])
def test_an_empty_suffix_is_a_plain_completion(suffix: str | None) -> None:
    model = FakeModel(fim=True)
    status, body = completion(model, prompt="ab", suffix=suffix)
    assert status == 200 and body["usage"]["prompt_tokens"] == 2
    assert model.cached[:2] == model.tokenize("ab")


def test_a_model_without_fill_in_the_middle_tokens_refuses_a_suffix() -> None:
    status, body = completion(FakeModel(), prompt="def f(", suffix="):\n")
    assert status == 400
    assert body["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in body["error"]["message"]


# --- /infill, as the editor plugins send it to llama.cpp's server ---

# llama.vim (autoload/llama.vim, llama#fim): the lines before the cursor, the cursor line
# typed so far, the rest; the ring buffer's chunks of other files ({text, time: reltime(),
# filename}); the reply limited to the fields it reads.
VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
              "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
              "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated",
              "tokens_cached"]
CHUNKS = [{"text": "def helper(x):\n    return x\n", "time": [1767225600, 123456],
           "filename": "util.py"},
          {"text": "import os\n", "time": [1767225601, 5], "filename": "main.py"}]
VIM_FIM = {"id_slot": 0, "input_prefix": "def f(a, b):\n", "input_suffix": "\nprint(f(1, 2))\n",
           "input_extra": CHUNKS, "prompt": "    ", "n_predict": 128, "stop": [], "n_indent": 4,
           "top_k": 40, "top_p": 0.90, "samplers": ["top_k", "top_p", "infill"],
           "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
           "t_max_predict_ms": 250, "response_fields": VIM_FIELDS, "model": ""}
# llama.vim's s:ring_update: the chunks alone, evaluated so that the next request finds them
VIM_RING = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": CHUNKS,
            "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""], "model": ""}
# llama.vscode (src/llama-server.ts, createRequestPayload): chunks timed by Date.now(),
# three completions asked for (max_parallel_completions), the extension's defaults
VSCODE_CHUNKS = [{**c, "time": 1767225600123} for c in CHUNKS]
VSCODE_FIM = {"id_slot": 0, "input_prefix": "def f(a, b):\n", "input_suffix": "\nprint(f(1, 2))\n",
              "input_extra": VSCODE_CHUNKS, "prompt": "    ", "n_predict": 128, "n_cmpl": 3,
              "top_k": 40, "top_p": 0.99, "stream": False,
              "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
              "t_max_prompt_ms": 500, "t_max_predict_ms": 500}
VSCODE_WARM_UP = {"id_slot": 0, "input_prefix": "", "input_suffix": "",
                  "input_extra": VSCODE_CHUNKS, "prompt": "", "n_predict": 0, "samplers": [],
                  "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}
# what llama.vim checks before it decodes a reply
VIM_LOOKS_FOR = re.compile(r'^\s*\{.*"content"\s*:"', re.DOTALL)


def infill_app(model: FakeModel, clock: VirtualClock | None = None, **settings: object) -> Any:
    return create_app(make_settings(**{"calibrate": False, "max_tokens": 8, **settings}), model,
                      **({"clock": clock} if clock is not None else {}))


def ids(model: FakeModel, text: str) -> list[int]:
    return model.tokenize(text, add_bos=False)


def extra_ids(model: FakeModel, chunks: list[dict[str, Any]]) -> list[int]:
    """The chunks as llama.cpp's server lays them out for a model with repo-level markers."""
    rep, sep = model.fim_repo_tokens
    out = [rep, *ids(model, "myproject\n")]
    for chunk in chunks:
        out += [sep, *ids(model, chunk["filename"] + "\n"), *ids(model, chunk["text"])]
    return [*out, sep, *ids(model, "filename\n")]


def infill_prompt(model: FakeModel, body: dict[str, Any]) -> list[int]:
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    return [*extra_ids(model, body.get("input_extra", [])), pre, *ids(model, body["input_prefix"]),
            *ids(model, body.get("prompt", "")), suf, *ids(model, body["input_suffix"]), mid]


class Typist(FakeModel):
    """A fill-in-the-middle fake that writes `text` after its middle marker, one character
    a token, then ends."""

    def __init__(self, text: str, **kw: Any) -> None:
        super().__init__(fim=True, **kw)
        self.script = self.tokenize(text, add_bos=False)

    def logits_for(self, context: Sequence[int]) -> np.ndarray:  # type: ignore[override]
        mid = self.fim_tokens[2]  # type: ignore[index]
        i = len(context) - 1 - max(j for j, t in enumerate(context) if t == mid)
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[self.script[i] if i < len(self.script) else 0] = 10.0
        return logits


def test_llama_vims_request_is_answered_with_the_fields_it_reads() -> None:
    model = FakeModel(fim=True)
    with TestClient(infill_app(model)) as client:
        r = client.post("/infill", json=VIM_FIM)
    assert r.status_code == 200, r.text
    assert VIM_LOOKS_FOR.match(r.text), r.text  # compact JSON: "content":"
    reply = r.json()
    assert sorted(reply) == sorted(VIM_FIELDS), reply  # nested names flattened, nothing else
    assert reply["timings/predicted_n"] >= 1 and reply["timings/prompt_ms"] >= 0
    assert reply["tokens_cached"] >= len(infill_prompt(model, VIM_FIM)) and \
        reply["truncated"] is False


def test_llama_vims_ring_update_evaluates_the_chunks_for_the_next_request() -> None:
    model = FakeModel(fim=True)
    with TestClient(infill_app(model)) as client:
        warm = client.post("/infill", json=VIM_RING)
        assert warm.status_code == 200, warm.text
        assert warm.json() == {}  # response_fields [""] names nothing
        assert model.cached[:len(infill_prompt(model, VIM_RING))] == \
            infill_prompt(model, VIM_RING)  # the whole prompt evaluated, nothing generated
        r = client.post("/infill", json={**VIM_FIM, "response_fields": [
            "timings/cache_n", "timings/prompt_n"]})
    # the chunks (and the prefix marker after them) were cached by the warm-up
    assert r.json()["timings/cache_n"] == len(extra_ids(model, CHUNKS)) + 1, r.json()


def test_llama_vscodes_request_is_answered_with_one_completion() -> None:
    model = FakeModel(fim=True)
    with TestClient(infill_app(model)) as client:
        r = client.post("/infill", json=VSCODE_FIM)
    assert r.status_code == 200, r.text
    reply = r.json()
    assert isinstance(reply["content"], str)  # one object: getComplFromContent's first case
    # what its status bar shows
    assert reply["generation_settings"]["n_ctx"] == model.n_ctx
    assert reply["tokens_cached"] > 0
    for key in ("prompt_n", "prompt_ms", "prompt_per_second", "predicted_n", "predicted_ms",
                "predicted_per_second"):
        assert reply["timings"][key] >= 0, key
    assert reply["timings"]["predicted_n"] == reply["tokens_predicted"] > 0


@pytest.mark.parametrize("body", [VIM_RING, VSCODE_WARM_UP], ids=["llama.vim", "llama.vscode"])
def test_a_warm_up_with_nothing_to_predict_evaluates_its_prompt_and_says_nothing(
        body: dict[str, Any]) -> None:
    model = FakeModel(fim=True)
    with TestClient(infill_app(model)) as client:
        r = client.post("/infill", json={**body, "response_fields": None})
    assert r.status_code == 200, r.text
    reply = r.json()
    assert reply["content"] == "" and reply["tokens_predicted"] == 0, reply
    prompt = infill_prompt(model, body)
    assert reply["tokens_evaluated"] == len(prompt) and model.cached == prompt


def test_other_files_go_before_the_prefix_as_files_of_the_repository() -> None:
    """llama.cpp's repo-level layout: [FIM_REP]myproject, [FIM_SEP]name and text per chunk,
    [FIM_SEP]filename, then [FIM_PRE]prefix+prompt[FIM_SUF]suffix[FIM_MID]."""
    model = FakeModel(fim=True)
    body = {"input_prefix": "ab\n", "prompt": "c", "input_suffix": "\nd", "n_predict": 2,
            "input_extra": [{"text": "xy\n", "filename": "x.py"}, {"text": "z\n"}]}
    with TestClient(infill_app(model)) as client:
        assert client.post("/infill", json=body).status_code == 200
    rep, sep = model.fim_repo_tokens
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    prompt = [rep, *ids(model, "myproject\n"), sep, *ids(model, "x.py\n"), *ids(model, "xy\n"),
              sep, *ids(model, "tmp\n"), *ids(model, "z\n"), sep, *ids(model, "filename\n"),
              pre, *ids(model, "ab\nc"), suf, *ids(model, "\nd"), mid]
    assert model.cached[:len(prompt)] == prompt


def test_without_file_separators_chunks_are_marked_as_snippets() -> None:
    model = FakeModel(fim=True)
    model.fim_repo_tokens = (None, None)
    body = {"input_prefix": "a", "input_suffix": "b", "n_predict": 1,
            "input_extra": [{"text": "xy", "filename": "x.py"}]}
    with TestClient(infill_app(model)) as client:
        assert client.post("/infill", json=body).status_code == 200
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    prompt = [*ids(model, "\n\n--- snippet ---\n\n"), *ids(model, "xy"), pre, *ids(model, "a"),
              suf, *ids(model, "b"), mid]
    assert model.cached[:len(prompt)] == prompt


def test_prefix_suffix_and_chunks_are_cut_to_llama_cpps_budgets() -> None:
    """Of a batch of 16: the prefix's last 12 tokens, the suffix's first 4 - 2 - 1 (the line
    typed takes one); of the chunks the last n_ctx - batch - 2 * n_predict (lead's default
    max_tokens, as llama.cpp's server's own n_predict) tokens."""
    model = FakeModel(fim=True, n_ctx=64)
    body = {"input_prefix": "abcdefghijklmnopqrst", "prompt": "u", "input_suffix": "vwxyz",
            "input_extra": [{"text": "0123456789" * 6, "filename": "n.py"}], "n_predict": 1}
    with TestClient(infill_app(model, batch_size=16)) as client:
        assert client.post("/infill", json=body).status_code == 200
    pre, suf, mid = model.fim_tokens  # type: ignore[misc]
    extra = extra_ids(model, body["input_extra"])[-(64 - 16 - 2 * 8):]
    prompt = [*extra, pre, *ids(model, "ijklmnopqrst"), *ids(model, "u"), suf, *ids(model, "v"),
              mid]
    assert model.cached[:len(prompt)] == prompt


@pytest.mark.parametrize(("text", "content"), [
    ("x:1\n    y:2\n  z\nq", "x:1\n    y:2\n  "),  # a line indented less ends the reply
    ("x:1\n\n    y:2\n", "x:1\n"),  # an empty line too, as llama.cpp's server has it
    ("  x:1\n    y:2\n", "  x:1\n    y:2\n"),  # the cursor's own line is not judged
])
def test_n_indent_ends_the_reply_at_a_line_indented_less(text: str, content: str) -> None:
    model = Typist(text)
    body = {"input_prefix": "def f():\n", "input_suffix": "\n", "prompt": "    ",
            "n_predict": 40, "n_indent": 4}
    with TestClient(infill_app(model, max_tokens=40)) as client:
        whole = client.post("/infill", json=body).json()
        with client.stream("POST", "/infill", json={**body, "stream": True}) as s:
            events = list(sse_events(s))
    assert whole["content"] == content, whole
    assert "".join(e["content"] for e in events) == content
    ended = whole["tokens_predicted"] < len(text) + 1
    assert whole["stop_type"] == ("limit" if ended else "eos"), whole


def test_t_max_predict_ms_ends_the_reply_at_a_new_line_once_it_has_passed() -> None:
    clock = VirtualClock()
    model = Typist("a\n" * 10, cost_s=(0.1, 0.0), clock=clock)  # 100 ms a step
    body = {"input_prefix": "", "input_suffix": "", "n_predict": 40, "t_max_predict_ms": 250}
    with TestClient(infill_app(model, clock, max_tokens=40, ngram=False)) as client:
        reply = client.post("/infill", json=body).json()
    # tokens 0.1 s apart from the first: the new line at 0.3 s is the first past 250 ms
    assert reply["content"] == "a\n" * 2 and reply["stop_type"] == "limit", reply


@pytest.mark.parametrize(("fields", "expected"), [
    (["content", "generation_settings/n_predict", "timings/nope", "nope"],
     {"content", "generation_settings/n_predict"}),
    ([""], set()),
    ([], None),  # empty: the whole reply
])
def test_response_fields_keep_only_what_they_name(fields: list[str],
                                                   expected: set[str] | None) -> None:
    with TestClient(infill_app(FakeModel(fim=True))) as client:
        reply = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b",
                                             "n_predict": 3, "response_fields": fields}).json()
    if expected is None:
        assert {"content", "timings", "generation_settings", "tokens_cached"} <= set(reply)
    else:
        assert set(reply) == expected, reply
    if "generation_settings/n_predict" in reply:
        assert reply["generation_settings/n_predict"] == 3


def test_timings_count_the_prompt_and_the_reply() -> None:
    with TestClient(infill_app(FakeModel(fim=True))) as client:
        reply = client.post("/infill", json={"input_prefix": "a", "input_suffix": "b",
                                             "n_predict": 3}).json()
    t = reply["timings"]
    assert t["prompt_n"] + t["cache_n"] == reply["tokens_evaluated"]
    assert t["predicted_n"] == reply["tokens_predicted"] == 3
    assert reply["stop"] is True and reply["stop_type"] == "limit"


def test_infill_streams_as_llama_server_does() -> None:
    model = FakeModel(fim=True, eos_bias=-100.0)
    body = {"input_prefix": "def f(", "input_suffix": ")", "n_predict": 8}
    with TestClient(infill_app(model)) as client:
        whole = client.post("/infill", json=body).json()
        with client.stream("POST", "/infill", json={**body, "stream": True}) as s:
            events = list(sse_events(s))
    expected = model.greedy_continuation(infill_prompt(model, body), 8)
    assert whole["content"] == "".join(model.token_bytes(t).decode() for t in expected)
    assert whole["tokens_predicted"] == 8 and whole["stop_type"] == "limit"
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop"] is True and all(not e["stop"] for e in events[:-1])
    assert events[-1]["timings"]["predicted_n"] == 8


@pytest.mark.parametrize(("extra", "param"), [
    ({"n_cmpl": 2, "temperature": 0.7}, "n_cmpl"),  # different completions: one is served
    ({"samplers": ["top_k", "mirostat_v3"]}, "samplers[1]"),
    ({"lora": [{"id": 0, "scale": 0.5}]}, "lora"),
])
def test_what_would_change_the_completion_unseen_is_refused_by_name(extra: dict[str, Any],
                                                                     param: str) -> None:
    with TestClient(infill_app(FakeModel(fim=True))) as client:
        r = client.post("/infill", json={**VSCODE_FIM, **extra})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_a_sampler_left_out_of_samplers_is_off() -> None:
    with TestClient(infill_app(FakeModel(fim=True))) as client:
        settings = client.post("/infill", json={**VSCODE_FIM, "samplers": ["top_p"]}).json()[
            "generation_settings"]
    assert (settings["top_k"], settings["top_p"]) == (0, 0.99)

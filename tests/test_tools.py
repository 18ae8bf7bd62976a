"""Tool calling's pure core (lead/apis/tools.py, lead/apis/toolparse.py): the call format from a
chat template, tools and tool_choice checked, messages as templates read them, replies
parsed whole and streamed. Tests that read a real GGUF are in the real tier and skip
where the file is missing."""

from __future__ import annotations

import ctypes
import itertools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lead.apis.toolparse import HERMES, LLAMA3, MISTRAL, CallFormat, ToolStream, parse_reply
from lead.apis.tools import (
    ToolChoice,
    ToolsError,
    call_grammar,
    check_tool_choice,
    check_tools,
    detect_format,
    plan_tools,
    template_messages,
    wrap_gbnf,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
PARIS = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
LYON = '{"name": "get_weather", "arguments": {"city": "Lyon"}}'

# Excerpts of real templates, each the lines that write a call in history.
QWEN_EXCERPT = """{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}
{{- '", "arguments": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"""
LLAMA32_EXCERPT = """{%- set tool_call = message.tool_calls[0].function %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
{{- '{"name": "' + tool_call.name + '", ' }}{{- '"parameters": ' }}
{{- tool_call.arguments | tojson }}{{- "}" }}{{- "<|eot_id|>" }}"""
MISTRAL_SMALL_EXCERPT = """{{- "[TOOL_CALLS] [" }}{%- for tool_call in tool_calls %}
{%- set out = tool_call.function|tojson %}{{- out[:-1] }}"""
# SmolLM2-135M-Instruct's whole template: no tools.
SMOLLM2 = """{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' \
%}{{ '<|im_start|>system
You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %}"""


def ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {"id": f"call_{n}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)}}


# --- detection ---

@pytest.mark.parametrize(("template", "fmt"), [
    (QWEN_EXCERPT, HERMES), (LLAMA32_EXCERPT, LLAMA3), (MISTRAL_SMALL_EXCERPT, MISTRAL),
    ("{{- '<|python_tag|>' + tool_call.name + '.call(' }}", LLAMA3),
    (SMOLLM2, None), ("", None), (None, None)])
def test_the_call_format_is_read_from_the_template(template: str | None,
                                                   fmt: CallFormat | None) -> None:
    assert detect_format(template) == fmt


# --- tools and tool_choice ---

def test_tools_are_normalised_and_choice_defaults_to_auto() -> None:
    bare = {"type": "function", "function": {"name": "ping"}}
    checked = check_tools([WEATHER, bare])
    assert checked[0] == WEATHER
    assert checked[1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert check_tool_choice(None, checked) == ToolChoice("auto")
    assert check_tool_choice(None, []) == ToolChoice("none")
    assert check_tool_choice({"type": "function", "function": {"name": "ping"}}, checked) \
        == ToolChoice("required", "ping")


@pytest.mark.parametrize(("tools", "param"), [
    ({"type": "function"}, "tools"),
    ([{"type": "retrieval"}], "tools[0].type"),
    ([WEATHER, {"type": "function"}], "tools[1].function"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": "x"}}],
     "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}],
     "tools[0].function.description"),
    ([WEATHER, WEATHER], "tools[1].function.name"),
])
def test_tools_not_shaped_as_openai_names_the_field(tools: Any, param: str) -> None:
    with pytest.raises(ToolsError) as caught:
        check_tools(tools)
    assert caught.value.param == param and str(caught.value).startswith(f"{param}: ")


@pytest.mark.parametrize(("choice", "tools", "param"), [
    ({"type": "function", "function": {"name": "nope"}}, [WEATHER], "tool_choice.function.name"),
    ({"type": "function"}, [WEATHER], "tool_choice"),
    ("sometimes", [WEATHER], "tool_choice"),
    ("required", [], "tool_choice"),
    ("auto", None, "tool_choice"),
])
def test_a_bad_tool_choice_names_the_field(choice: Any, tools: Any, param: str) -> None:
    with pytest.raises(ToolsError) as caught:
        plan_tools(QWEN_EXCERPT, tools, choice)
    assert caught.value.param == param


def test_tool_choice_none_renders_no_tools_and_parses_nothing() -> None:
    plan = plan_tools(SMOLLM2, [WEATHER], "none")  # any template: nothing is asked of it
    assert plan.template_tools() is None and plan.stream() is None and plan.grammar is None
    assert plan.parse(f"<tool_call>{PARIS}</tool_call>") == \
        (f"<tool_call>{PARIS}</tool_call>", [])
    assert plan_tools(SMOLLM2, None, None).stream() is None


def test_tools_on_a_template_without_a_call_format_take_the_generic_one() -> None:
    plan = plan_tools(SMOLLM2, [WEATHER], None)
    assert plan.generic and plan.template_tools() is None  # described in a system message
    assert plan.grammar is not None and "anyOf" in plan.grammar.schema  # a call or an answer
    required = plan_tools(SMOLLM2, [WEATHER], "required")
    assert required.grammar is not None and "anyOf" not in required.grammar.schema
    assert plan.parse('{"response": "sunny"}') == ("sunny", [])
    content, calls = plan.parse('{"tool_call": {"name": "get_weather", "arguments": '
                                '{"city": "Paris"}}}')
    assert content is None and calls[0]["function"]["name"] == "get_weather"


def test_auto_renders_tools_and_parses_only_their_names() -> None:
    plan = plan_tools(QWEN_EXCERPT, [WEATHER], "auto")
    assert plan.template_tools() == [WEATHER] and plan.grammar is None
    stream = plan.stream()
    assert stream is not None and stream.names == {"get_weather"}
    content, calls = plan.parse(f"<tool_call>{PARIS}</tool_call>")
    assert content is None and calls[0]["function"]["arguments"] == '{"city": "Paris"}'


# --- forced calls: the schema and the grammar around it ---

def test_a_named_choice_forces_that_call() -> None:
    tools = check_tools([WEATHER, TIME])
    grammar = call_grammar(HERMES, tools, ToolChoice("required", "get_time"))
    assert grammar is not None
    assert (grammar.prefix, grammar.suffix) == ("<tool_call>\n", "\n</tool_call>")
    assert grammar.schema == {"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": "get_time"}, "arguments": TIME["function"]["parameters"]}}


def test_a_forced_call_keeps_the_parameters_refs_resolving() -> None:
    """Pydantic-made parameters refer to "#/$defs/...": the defs go to the call schema's
    root, so a call the tool accepts validates against the forced call's schema."""
    import jsonschema

    item = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    order = {"type": "function", "function": {"name": "order", "parameters": {
        "type": "object", "properties": {"item": {"$ref": "#/$defs/Item"}},
        "required": ["item"], "$defs": {"Item": item}}}}
    for fmt in (HERMES, MISTRAL):
        grammar = call_grammar(fmt, check_tools([order, WEATHER]), ToolChoice("required"))
        assert grammar is not None and grammar.schema["$defs"] == {"Item": item}
        call = {"name": "order", fmt.key: {"item": {"sku": "A1"}}}
        jsonschema.validate([call] if fmt.array else call, grammar.schema)
        with pytest.raises(jsonschema.ValidationError):
            bad = {"name": "order", fmt.key: {"item": {"size": 2}}}
            jsonschema.validate([bad] if fmt.array else bad, grammar.schema)
    clash = {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "$defs": {"Item": {"type": "integer"}}}}}
    with pytest.raises(ToolsError) as refused:
        call_grammar(HERMES, check_tools([order, clash]), ToolChoice("required"))
    assert refused.value.param == "tools"


def test_required_allows_any_tool_in_each_format() -> None:
    tools = check_tools([WEATHER, TIME])
    hermes = call_grammar(HERMES, tools, ToolChoice("required"))
    assert hermes is not None and len(hermes.schema["anyOf"]) == 2
    llama = call_grammar(LLAMA3, tools, ToolChoice("required"))
    assert llama is not None and llama.prefix == "" and \
        llama.schema["anyOf"][0]["required"] == ["name", "parameters"]
    mistral = call_grammar(MISTRAL, tools, ToolChoice("required"))
    assert mistral is not None and mistral.prefix == "[TOOL_CALLS]"
    assert mistral.schema["type"] == "array" and mistral.schema["minItems"] == 1
    assert call_grammar(HERMES, tools, ToolChoice("auto")) is None


def test_the_gbnf_wraps_the_schema_in_the_calls_markers() -> None:
    pytest.importorskip("llama_cpp")
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    grammar = call_grammar(HERMES, check_tools([WEATHER]), ToolChoice("required"))
    assert grammar is not None
    gbnf = wrap_gbnf(json_schema_to_gbnf(json.dumps(grammar.schema)), grammar)
    lines = gbnf.splitlines()
    assert lines[0] == 'root ::= "<tool_call>\\n" call-json "\\n</tool_call>"'
    assert sum(line.startswith("root ::=") for line in lines) == 1
    assert any(line.startswith("call-json ::=") for line in lines)


# --- messages for the template ---

HISTORY = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C"},
]


def test_messages_carry_calls_as_templates_read_them() -> None:
    user, assistant, tool = template_messages(HISTORY)
    assert user == {"role": "user", "content": "Weather in Paris?"}  # no tool_calls key
    assert assistant["content"] == ""
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert tool == {"role": "tool", "tool_call_id": "call_1", "content": "22 C",
                    "name": "get_weather"}
    no_args = {"role": "assistant", "tool_calls": [
        {"id": "c", "function": {"name": "ping", "arguments": ""}}]}
    assert template_messages([no_args])[0]["tool_calls"][0]["function"]["arguments"] == {}


@pytest.mark.parametrize(("calls", "param"), [
    ([{"id": "c", "function": {"name": "f", "arguments": "[1]"}}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"id": "c", "function": {"name": "f", "arguments": "{oops"}}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"function": {"name": "f", "arguments": "{}"}}], "messages[0].tool_calls[0].id"),
    ([{"id": "c"}], "messages[0].tool_calls[0].function"),
    ({"id": "c"}, "messages[0].tool_calls"),
])
def test_bad_calls_in_history_name_the_field(calls: Any, param: str) -> None:
    with pytest.raises(ToolsError) as caught:
        template_messages([{"role": "assistant", "content": "", "tool_calls": calls}])
    assert caught.value.param == param


def test_the_llama_branch_renders_arguments_as_a_mapping() -> None:
    pytest.importorskip("llama_cpp")
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template = "{% for message in messages %}{% if 'tool_calls' in message %}" + \
        LLAMA32_EXCERPT + "{% endif %}{% endfor %}"
    prompt = Jinja2ChatFormatter(template, eos_token="", bos_token="")(
        messages=template_messages(HISTORY)).prompt
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in prompt


# --- parsing a finished reply ---

@pytest.mark.parametrize(("reply", "content", "calls"), [
    ("Just text.\n", "Just text.\n", []),
    (f"<tool_call>\n{PARIS}\n</tool_call>", None, [("Paris", 0)]),
    (f"Let me check.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{LYON}\n</tool_call>",
     "Let me check.", [("Paris", 0), ("Lyon", 1)]),
    (f"<tool_call>\n{PARIS}\n</tool_call>\n\nDone.", "Done.", [("Paris", 0)]),
    (f"<tool_call>\n{PARIS}", None, [("Paris", 0)]),  # the closing never came: still whole
    ("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par",
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", []),
    ("a <tool_call>{oops}</tool_call> b", "a <tool_call>{oops}</tool_call> b", []),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
     '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', []),  # not a tool
    ('<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}</tool_call>',
     None, [("Paris", 0)]),  # arguments written as a JSON string
    ('<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>',
     '<tool_call>{"name": "get_weather", "arguments": [1]}</tool_call>', []),
    ("x < y and <tool_call", "x < y and <tool_call", []),
    # What Qwen2.5-Coder 1.5B and 0.5B write, greedy, given the real template and tools:
    ('```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```',
     None, [("Paris", 0)]),
    (f"{PARIS}\n", None, [("Paris", 0)]),
    # a bare call is a call once it closes (emitted then): what follows it is content
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}\n{"temp_c": 22}',
     '{"temp_c": 22}', [("Paris", 0)]),
    ("```python\nprint(1)\n```", "```python\nprint(1)\n```", []),
    (f"Sure: {PARIS}", f"Sure: {PARIS}", []),  # bare JSON counts only opening the reply
])
def test_hermes_replies(reply: str, content: str | None, calls: list[tuple[str, int]]) -> None:
    got_content, got_calls = parse_reply(HERMES, reply, {"get_weather"}, ids())
    assert got_content == content
    assert got_calls == [call("get_weather", {"city": c}, n) for c, n in calls]


@pytest.mark.parametrize(("fmt", "reply", "content", "n_calls"), [
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, 1),
    (LLAMA3, '\n<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', None, 1),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
             '{"name": "get_weather", "parameters": {"city": "Lyon"}}', None, 2),
    (LLAMA3, '{"city": "Paris"}', '{"city": "Paris"}', 0),  # JSON, but not a call
    (LLAMA3, '{"name": "get_weather", "parameters": {}} and more', "and more", 1),
    (LLAMA3, 'Here: {"name": "get_weather", "parameters": {}}',
     'Here: {"name": "get_weather", "parameters": {}}', 0),  # a call opens the reply
    (MISTRAL, f"[TOOL_CALLS] [{PARIS}, {LYON}]", None, 2),
    (MISTRAL, f"Sure.[TOOL_CALLS][{PARIS}]", "Sure.", 1),
    (MISTRAL, f"[TOOL_CALLS] [{PARIS}", f"[TOOL_CALLS] [{PARIS}", 0),
    (MISTRAL, f"[{PARIS}]", None, 1),  # the marker, a control token, left out of the text
    (MISTRAL, "[1, 2]", "[1, 2]", 0),
])
def test_llama_and_mistral_replies(fmt: CallFormat, reply: str, content: str | None,
                                   n_calls: int) -> None:
    got_content, got_calls = parse_reply(fmt, reply, {"get_weather"}, ids())
    assert got_content == content and len(got_calls) == n_calls
    assert all(c["function"]["name"] == "get_weather" for c in got_calls)


# --- streaming ---

def streamed(fmt: CallFormat, chunks: list[str]) -> tuple[str, list[dict[str, Any]], ToolStream]:
    """Content and calls as a client accumulates them (the openai SDK's way)."""
    stream = ToolStream(fmt, {"get_weather"}, ids())
    deltas = [d for chunk in chunks for d in stream.push(chunk)] + stream.finish()
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for piece in delta.get("tool_calls", []):
            index = piece["index"]
            entry = calls.setdefault(index, {"id": piece["id"], "type": piece["type"],
                                             "function": {"name": "", "arguments": ""}})
            for key in ("name", "arguments"):
                entry["function"][key] += piece["function"].get(key, "")
    return "".join(d.get("content", "") for d in deltas), list(calls.values()), stream


def splits(text: str) -> Iterator[list[str]]:
    for i in range(len(text) + 1):
        yield [text[:i], text[i:]]
    for i in range(0, len(text), 3):
        for j in range(i, len(text), 5):
            yield [text[:i], text[i:j], text[j:]]


REPLIES = [
    (HERMES, f"Let me check.\n<tool_call>\n{PARIS}\n</tool_call>\n<tool_call>\n{LYON}\n"
             "</tool_call>\nOK."),
    (HERMES, "a < b <tool_call>{oops}</tool_call> <tool_"),
    (HERMES, f"```json\n{PARIS}\n```\n```json\n{LYON}\n```"),
    (HERMES, "``` python\nprint(1)\n```"),
    (LLAMA3, '  <|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    (LLAMA3, 'Plain answer, {"name": "x"}'),
    (MISTRAL, f"Sure. [TOOL_CALLS] [{PARIS}, {LYON}]"),
    (MISTRAL, f" [TOOL_CALLS][{PARIS}]"),
    (MISTRAL, f"[{PARIS}, {LYON}]"),
]


@pytest.mark.parametrize(("fmt", "reply"), REPLIES)
def test_every_chunk_boundary_streams_what_the_whole_reply_parses_to(fmt: CallFormat,
                                                                    reply: str) -> None:
    content, calls = parse_reply(fmt, reply, {"get_weather"}, ids())
    for chunks in splits(reply):
        got_content, got_calls, _ = streamed(fmt, chunks)
        assert (got_content, got_calls) == (content or "", calls), chunks


SEGMENTS = ["Hi", " ", "\n", "<", "<tool", "x < y", f"<tool_call>\n{PARIS}\n</tool_call>",
            f"<tool_call>{LYON}</tool_call>", "<tool_call>{bad}</tool_call>", "</tool_call>",
            f"```json\n{PARIS}\n```", PARIS, "```", "`"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(SEGMENTS), max_size=8), st.data())
def test_any_chunking_of_any_reply_streams_the_same(parts: list[str], data: st.DataObject) -> None:
    reply = "".join(parts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=6)))
    chunks = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
    content, calls = parse_reply(HERMES, reply, {"get_weather"}, ids())
    assert streamed(HERMES, chunks)[:2] == (content or "", calls)
    if not reply.lstrip().startswith(("{", "`")):  # a bare call runs to the end
        assert f"<tool_call>\n{PARIS}" not in (content or "")  # a good call never leaks


def test_content_passes_at_once_but_a_possible_marker_is_held() -> None:
    stream = ToolStream(HERMES, {"get_weather"}, ids())
    assert stream.push("Hello wor") == [{"content": "Hello wor"}]
    assert stream.push("ld, <tool") == [{"content": "ld,"}]  # " <tool" may open a call
    assert stream.push("box> is a tag") == [{"content": " <toolbox> is a tag"}]
    assert stream.push(f"\n<tool_call>\n{PARIS}\n") == []
    assert stream.push("</tool_call>") == [{"tool_calls": [{
        "index": 0, **call("get_weather", {"city": "Paris"}, 0)}]}]
    assert stream.finish() == [] and stream.finish_reason("stop") == "tool_calls"
    assert stream.finish_reason("length") == "length"


def test_a_code_block_is_held_only_until_it_cannot_be_a_fenced_call() -> None:
    stream = ToolStream(HERMES, {"get_weather"}, ids())
    assert stream.push("\n``") == [] and stream.push("`js") == []
    assert stream.push("x\n") == [{"content": "\n```jsx"}]  # whitespace after: held
    assert stream.finish() == [{"content": "\n"}]


def test_a_reply_without_calls_keeps_its_finish_reason() -> None:
    content, calls, stream = streamed(HERMES, ["a <", "tool_call> b"])
    assert content == "a <tool_call> b" and calls == []
    assert stream.finish_reason("stop") == "stop"


# --- the real templates ---

def gguf(name: str) -> Path:
    from shared.presets import PRESETS, cache_dir

    path = cache_dir() / PRESETS[name].filename
    if not path.exists():
        pytest.skip(f"{path} is not here (python -m shared.presets {name})")
    return path


def chat_template(name: str) -> tuple[str, Any]:
    llama_cpp = pytest.importorskip("llama_cpp")
    llm = llama_cpp.Llama(str(gguf(name)), vocab_only=True, verbose=False)
    return llm.metadata.get("tokenizer.chat_template", ""), llm


@pytest.mark.real
@pytest.mark.parametrize(("name", "fmt"), [
    ("qwen2.5-coder-1.5b", HERMES), ("qwen2.5-coder-0.5b", HERMES), ("smollm2-135m", None)])
def test_the_real_templates_families(name: str, fmt: CallFormat | None) -> None:
    assert detect_format(chat_template(name)[0]) == fmt


@pytest.mark.real
def test_qwens_template_renders_tools_a_call_and_its_result() -> None:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    template, _ = chat_template("qwen2.5-coder-1.5b")
    plan = plan_tools(template, [WEATHER], "auto")
    render = Jinja2ChatFormatter(template, eos_token="<|im_end|>", bos_token="")
    prompt = render(messages=template_messages(HISTORY), tools=plan.template_tools()).prompt
    assert f"<tools>\n{json.dumps(WEATHER)}\n</tools>" in prompt
    turn = f"<|im_start|>assistant\n<tool_call>\n{PARIS}\n</tool_call><|im_end|>\n"
    assert turn in prompt
    assert "<|im_start|>user\n<tool_response>\n22 C\n</tool_response><|im_end|>\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    # The call in history parses back to itself.
    content, calls = parse_reply(HERMES, turn.split("\n", 1)[1].removesuffix("<|im_end|>\n"))
    assert content is None and [c["function"] for c in calls] == \
        [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    # Why arguments go to the template as a mapping: a JSON string renders quoted.
    raw = render(messages=[*HISTORY[:2]], tools=plan.template_tools()).prompt
    assert '"arguments": "{\\"city\\": \\"Paris\\"}"' in raw


@pytest.mark.real
def test_the_forced_call_grammar_takes_qwens_own_call_tokens() -> None:
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    _, llm = chat_template("qwen2.5-coder-1.5b")
    grammar = call_grammar(HERMES, check_tools([WEATHER, TIME]), ToolChoice("required"))
    assert grammar is not None
    gbnf = wrap_gbnf(json_schema_to_gbnf(json.dumps(grammar.schema)), grammar)
    good = llm.tokenize(f"<tool_call>\n{PARIS}\n</tool_call>".encode(), add_bos=False,
                        special=True)
    assert good[0] == llm.tokenize(b"<tool_call>", add_bos=False, special=True)[0]
    assert grammar_takes(llm, gbnf, good)
    wrong = llm.tokenize(b'<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',
                         add_bos=False, special=True)
    assert not grammar_takes(llm, gbnf, wrong)


def grammar_takes(llm: Any, gbnf: str, tokens: list[int]) -> bool:
    """Whether llama.cpp's grammar sampler lets `tokens` through one by one."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
    assert sampler, "the grammar does not parse"
    try:
        for token in tokens:
            data = (llama_cpp.llama_token_data * 1)(llama_cpp.llama_token_data(token, 0.0, 0.0))
            array = llama_cpp.llama_token_data_array(data=data, size=1, selected=-1,
                                                     sorted=False)
            llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
            if data[0].logit == float("-inf"):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(sampler)

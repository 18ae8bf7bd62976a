"""The coding agents themselves against lead, run as a user runs them: non-interactive,
with a timeout, telemetry off, in a home and a folder of their own (`make clients`
installs them, pinned: scripts/clients.sh; where one is not installed its test skips).

Over SmolLM2 in a real lead process, each client's turn finishes (exit 0) and every API
request it made got a 2xx (lead logs a line per request). There the clients run lean,
through their own switches: a one-line system prompt and no tools, so that SmolLM2
answers and ends (told "Say hi" under Claude Code's own prompt it wrote 16,000 tokens
without an end), and so that the prompts are short: the default first requests are
~23k tokens of SmolLM2's (Claude Code), 16k and 8k (qwen-code), 11k (Codex), 8k
(opencode), and lead on SmolLM2 read them here at ~100 tokens/s falling to ~30 past 8k
(Codex's took 2-3 minutes, Claude Code's would take over 10). The default requests go
through lead verbatim in tests/test_client_fixtures.py (in process, a fake model), and
whole, from the real clients, in the tool round trips here: a scripted model in a real
lead process (tests/scripted_lead.py) calls the client's own tool, the client runs it and
sends its result back, and finishes with the answer only that result unlocks. Also the
openai and anthropic SDKs, and /infill as llama.vim sends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.procs import Lead, Proc, free_port, wait_until
from shared.presets import PRESETS, cache_dir
from tests.test_infill import VIM_FIM

pytestmark = pytest.mark.real

CLIENTS = Path(os.environ.get("DUO_CLIENTS") or cache_dir() / "clients")
NPM_BIN = CLIENTS / "npm" / "node_modules" / ".bin"
AIDER = CLIENTS / "aider" / "bin" / "aider"
SMOL = "smollm2-135m"
FIM_MODEL = "qwen2.5-coder-0.5b"
# One generation holds a lean client's prompt and reply: SmolLM2's own context
CONTEXT = ("--ctx-size", "8192", "--parallel", "1")
CLIENT_S = 300  # a client's whole run (each takes seconds here)
KEY = "sk-duo-test"
# What SmolLM2 is told where a client lets it be (a short prompt it answers and ends)
BRIEF = "You are a helpful assistant. Answer in one short sentence."
# Codex keeps one tool (request_user_input), so lead holds SmolLM2 to its generic JSON
# format, and SmolLM2 calls it unless told not to
CODEX_BRIEF = 'Do not call tools. Answer the user in one short sentence, as {"response": "..."}.'
MODEL = "smollm2"


# --- running a client ---


def installed(name: str) -> Path:
    path = AIDER if name == "aider" else NPM_BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed: run `make clients`")
    if name != "aider" and shutil.which("node") is None:
        pytest.skip(f"{name} needs Node.js (20 or later), which is not on PATH")
    return path


@dataclass
class Ran:
    rc: int
    out: str
    err: str
    seconds: float

    def __str__(self) -> str:
        return (f"exit {self.rc} after {self.seconds:.1f} s\n--- stdout\n{self.out[-3000:]}"
                f"\n--- stderr\n{self.err[-3000:]}")


def run_client(argv: list[str], home: Path, cwd: Path, env: dict[str, str],
               timeout: float = CLIENT_S) -> Ran:
    """Run a client from a clean environment (only what is given here), stdin closed; its
    whole process group is killed at the timeout, and whatever of it outlives it after."""
    node = shutil.which("node")
    path = [str(NPM_BIN), *([str(Path(node).parent)] if node else []), "/usr/local/bin",
            "/usr/bin", "/bin"]
    base = {"PATH": ":".join(path), "HOME": str(home), "TERM": "dumb", "LANG": "C.UTF-8",
            "NO_COLOR": "1", "TMPDIR": str(home)}
    started = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env={**base, **env}, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"{argv[0]} did not finish in {timeout} s\n{out[-3000:]}\n"
                             f"{err[-3000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
    return Ran(p.returncode, out, err, time.monotonic() - started)


@dataclass
class Place:
    """A client's home and working folder."""

    home: Path
    work: Path


@pytest.fixture
def place(tmp_path: Path) -> Place:
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    return Place(home, work)


def claude(place: Place, url: str, prompt: str, lean: bool = False) -> Ran:
    """`lean`: a one-line system prompt, no tools, replies of at most 1024 tokens (it asks
    for 32000, which lead serves to the context's end)."""
    flags = ["--tools", "", "--system-prompt", BRIEF] if lean else []
    return run_client([str(installed("claude")), "-p", prompt, *flags], place.home,
                      place.work, {
                          "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": KEY,
                          "ANTHROPIC_MODEL": MODEL, "DISABLE_TELEMETRY": "1",
                          "DISABLE_ERROR_REPORTING": "1", "DISABLE_AUTOUPDATER": "1",
                          "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                          **({"CLAUDE_CODE_MAX_OUTPUT_TOKENS": "1024"} if lean else {})})


def codex(place: Place, url: str, prompt: str, lean: bool = False) -> Ran:
    """`lean`: its base instructions (17k characters) in one line, and of its tools only
    request_user_input (no shell, web search, images, goals or sub-agents)."""
    config = place.home / ".codex"
    config.mkdir(exist_ok=True)
    instructions = place.home / "instructions.md"
    instructions.write_text(CODEX_BRIEF + "\n")
    (config / "config.toml").write_text(f"""\
model = "{MODEL}"
model_provider = "duo"
check_for_update_on_startup = false
""" + (f"""\
model_instructions_file = "{instructions}"
web_search = "disabled"

[features]
multi_agent = false
shell_tool = false
unified_exec = false
view_image = false
goals = false
""" if lean else "") + f"""

[model_providers.duo]
name = "duo"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "DUO_API_KEY"

[analytics]
enabled = false
""")
    return run_client([str(installed("codex")), "exec", "--skip-git-repo-check", prompt],
                      place.home, place.work, {"CODEX_HOME": str(config), "DUO_API_KEY": KEY})


def opencode(place: Place, url: str, prompt: str, lean: bool = False) -> Ran:
    """`lean`: its build agent's prompt in one line, no tools."""
    config = place.home / ".config" / "opencode"
    config.mkdir(parents=True)
    lean_config = {"agent": {"build": {"prompt": BRIEF}}, "tools": {"*": False}} if lean \
        else {}
    (config / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"duo": {"npm": "@ai-sdk/openai-compatible", "name": "duo",
                             "options": {"baseURL": f"{url}/v1", "apiKey": KEY},
                             "models": {MODEL: {"name": MODEL}}}},
        "model": f"duo/{MODEL}", "autoupdate": False, "share": "disabled", **lean_config}))
    return run_client([str(installed("opencode")), "run", prompt], place.home, place.work,
                      {"OPENCODE_DISABLE_AUTOUPDATE": "1"})


QWEN_META_TOOLS = ["tool_search", "agent", "task_stop", "send_message", "skill",
                   "ask_user_question", "exit_plan_mode"]


def qwen(place: Place, url: str, prompt: str, lean: bool = False) -> Ran:
    """`lean`: its system prompt in one line, no tools, no memory extraction after the
    turn."""
    settings = place.home / ".qwen"
    settings.mkdir()
    lean_settings = {"memory": {"enableManagedAutoMemory": False},
                     "tools": {"core": ["none"], "exclude": QWEN_META_TOOLS}} if lean else {}
    (settings / "settings.json").write_text(json.dumps(
        {"privacy": {"usageStatisticsEnabled": False}, **lean_settings}))
    return run_client([str(installed("qwen")), "--auth-type", "openai", "-p", prompt,
                       *(["--system-prompt", BRIEF] if lean else [])],
                      place.home, place.work, {"OPENAI_API_KEY": KEY,
                                               "OPENAI_BASE_URL": f"{url}/v1",
                                               "OPENAI_MODEL": MODEL})


def aider(place: Place, url: str, prompt: str) -> Ran:
    return run_client([str(installed("aider")), "--model", f"openai/{MODEL}",
                       "--openai-api-base", f"{url}/v1", "--openai-api-key", KEY,
                       "--message", prompt, "--yes-always", "--no-git", "--no-check-update",
                       "--no-show-model-warnings", "--no-analytics", "--no-show-release-notes",
                       "--no-pretty"],
                      place.home, place.work, {})


CLIENTS_RUN = {"claude": claude, "codex": codex, "opencode": opencode, "qwen": qwen,
               "aider": aider}


# --- what lead said of each request ---

REQUEST = re.compile(r" lead INFO ([A-Z]+) (/\S*) (\d{3}|\(no reply[^)]*\)) in [\d.]+ s"
                     r"(?:: (.*))?$")


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: str
    error: str

    def __str__(self) -> str:
        return f"{self.method} {self.path} {self.status}" + (f": {self.error}" if self.error
                                                              else "")


class Logged:
    """The API requests lead logged from here on (one line each, written as its reply
    ends)."""

    MARK = Request("GET", "/docs", "200", "")  # logged, and open without a key

    def __init__(self, lead: Proc) -> None:
        self.lead, self.start = lead, len(lead.log())

    def requests(self) -> list[Request]:
        """Every request so far, once lead has logged all that came before a request of
        ours (a client may exit as its last reply ends, before lead's line for it)."""
        seen = self._all().count(self.MARK)
        httpx.get(f"{self.lead.url}/docs", timeout=10)  # type: ignore[attr-defined]
        wait_until(lambda: self._all().count(self.MARK) > seen, 10,
                   "lead's log line for GET /docs")
        return [r for r in self._all() if r != self.MARK]

    def _all(self) -> list[Request]:
        tail = self.lead.log()[self.start:]
        return [Request(*m.groups(default="")) for line in tail.splitlines()
                if (m := REQUEST.search(line))]


def assert_all_answered(logged: Logged, ran: Ran | None = None) -> list[Request]:
    requests = logged.requests()
    assert requests, f"the client sent lead no API request\n{ran}"
    refused = [str(r) for r in requests if not r.status.startswith("2")]
    assert not refused, f"lead refused {refused}\n{ran}"
    return requests


# --- over SmolLM2 ---


@pytest.fixture(scope="module")
def smol() -> Iterator[Lead]:
    if not (cache_dir() / PRESETS[SMOL].filename).is_file():
        pytest.skip("SmolLM2 is not installed: run `make models`")
    lead = Lead(SMOL, *CONTEXT, "--max-tokens", "256")  # Codex and aider send none
    yield lead
    lead.stop()


def test_claude_code_finishes_a_turn(smol: Lead, place: Place) -> None:
    logged = Logged(smol)
    ran = claude(place, smol.url, "Say hi", lean=True)
    assert ran.rc == 0, ran
    requests = assert_all_answered(logged, ran)
    assert [r.path for r in requests] == ["/v1/messages"], requests


@pytest.mark.parametrize("client, path", [
    (codex, "/v1/responses"), (opencode, "/v1/chat/completions"),
    (qwen, "/v1/chat/completions")], ids=["codex", "opencode", "qwen-code"])
def test_an_agent_finishes_a_turn(smol: Lead, place: Place, client: Callable[..., Ran],
                                  path: str) -> None:
    logged = Logged(smol)
    ran = client(place, smol.url, "Say hi", lean=True)
    # the client sends no temperature, so SmolLM2 samples: a reply that runs on to lead's
    # --max-tokens is answered as incomplete for that reason, which Codex reports and exits 1
    capped = client is codex and "Incomplete response returned, reason: max_output_tokens" \
        in ran.err
    assert ran.rc == 0 or capped, ran
    requests = assert_all_answered(logged, ran)
    assert {r.path for r in requests} == {path}, requests


def test_aider_finishes_a_turn(smol: Lead, place: Place) -> None:
    logged = Logged(smol)
    ran = aider(place, smol.url, "Say hi")
    assert ran.rc == 0, ran
    requests = assert_all_answered(logged, ran)
    assert [r.path for r in requests] == ["/v1/chat/completions"], requests


@pytest.mark.parametrize("stream", [False, True])
def test_the_openai_sdk_chats_and_responds(smol: Lead, stream: bool) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"{smol.url}/v1", api_key=KEY, max_retries=0)
    ask = [{"role": "user", "content": "Say hi"}]
    logged = Logged(smol)
    if stream:
        chunks = list(client.chat.completions.create(model=MODEL, messages=ask, max_tokens=16,
                                                     stream=True))
        finished = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finished[-1] in ("stop", "length") and not any(finished[:-1]), finished
        with client.responses.stream(model=MODEL, input="Say hi",
                                     max_output_tokens=16) as events:
            seen = list(events)  # (get_final_response wants response.completed alone)
        assert seen[-1].type in ("response.completed", "response.incomplete"), seen[-1]
        response = seen[-1].response
    else:
        chat = client.chat.completions.create(model=MODEL, messages=ask, max_tokens=16)
        assert chat.choices[0].finish_reason in ("stop", "length")
        assert chat.usage.completion_tokens > 0
        response = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=16)
    assert response.status in ("completed", "incomplete") and response.output_text
    requests = assert_all_answered(logged)
    assert [r.path for r in requests] == ["/v1/chat/completions", "/v1/responses"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_anthropic_sdk_messages(smol: Lead, stream: bool) -> None:
    from anthropic import Anthropic

    client = Anthropic(base_url=smol.url, api_key=KEY, max_retries=0)
    ask: Any = [{"role": "user", "content": "Say hi"}]
    logged = Logged(smol)
    count = client.messages.count_tokens(model=MODEL, messages=ask)
    assert count.input_tokens > 0
    if stream:
        with client.messages.stream(model=MODEL, max_tokens=16, messages=ask) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(model=MODEL, max_tokens=16, messages=ask)
    assert message.stop_reason in ("end_turn", "max_tokens") and message.content
    requests = assert_all_answered(logged)
    assert [r.path for r in requests] == ["/v1/messages/count_tokens", "/v1/messages"]


def test_llama_vims_fill_in_the_middle_request() -> None:
    """llama.vim's request as tests/test_infill.py copies it from the plugin, on the
    smallest preset with fill-in-the-middle tokens (SmolLM2 has none: a 400 there): a 2xx
    with the fields it asked for, the middle of a function."""
    if not (cache_dir() / PRESETS[FIM_MODEL].filename).is_file():
        pytest.skip(f"{FIM_MODEL} is not installed: run `make models`")
    lead = Lead(FIM_MODEL, "--ctx-size", "4096", "--parallel", "1")
    try:
        logged = Logged(lead)
        r = httpx.post(f"{lead.url}/infill", json=VIM_FIM, timeout=120,
                       headers={"Authorization": f"Bearer {KEY}"})
        assert_all_answered(logged)
    finally:
        lead.stop()
    assert r.status_code == 200, r.text
    got = r.json()
    assert set(got) == set(VIM_FIM["response_fields"]), got  # (nested ones flattened)
    assert isinstance(got["content"], str) and got["timings/predicted_n"] > 0, got


# --- a tool round trip, over a scripted model ---

SECRET = "the parrot is 4242 years old"  # what only the file holds (fake-tokenizer text)


@dataclass
class Scripted:
    lead: Proc
    url: str
    record: Path

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()]


def scripted_lead(tmp: Path, rules: list[tuple[str, str]], *flags: str) -> Scripted:
    """A lead process over tests/scripted_lead.py's model, answering by `rules`; `flags`:
    more of lead's."""
    port, record = free_port(), tmp / "requests.jsonl"
    proc = Proc(["-m", "tests.scripted_lead", "--port", str(port), "--no-calibrate",
                 "--ctx-size", str(1 << 18), "--parallel", "1", *flags],
                {"SCRIPTED_RULES": json.dumps(rules), "SCRIPTED_RECORD": str(record)},
                "scripted-lead")
    url = proc.wait_serving("scripted lead", port, 60)
    proc.url = url  # type: ignore[attr-defined]
    return Scripted(proc, url, record)


ANSWER = "The notes say the parrot is 4242 years old."
MISSED = "The tool's result did not hold the notes."


def round_trip(name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """The script: asked about the notes, call `name` (in the template's call format);
    with the tool's result, which holds the notes, answer; with one that does not, say so
    (rather than call again: a client would go on calling)."""
    call = json.dumps({"name": name, "arguments": arguments})
    return [(SECRET, ANSWER), (f"calls: {name}(", MISSED),  # (how the fake writes a call)
            ("What does notes", f"<tool_call>\n{call}\n</tool_call>")]


@pytest.fixture
def notes(place: Place) -> Path:
    path = place.work / "notes.txt"
    path.write_text(f"{SECRET}\n")
    return path


def test_claude_code_reads_a_file_with_its_read_tool_and_answers(
        place: Place, notes: Path, tmp_path: Path) -> None:
    installed("claude")
    lead = scripted_lead(tmp_path, round_trip("Read", {"file_path": str(notes)}))
    try:
        logged = Logged(lead.lead)
        ran = claude(place, lead.url, "What does notes.txt say?")
        assert ran.rc == 0, ran
        assert ANSWER in ran.out, ran
        requests = assert_all_answered(logged, ran)
        first, second = lead.bodies()
        assert [r.path for r in requests] == ["/v1/messages"] * 2
    finally:
        lead.lead.stop()
    uses = [b for m in second["body"]["messages"] if isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "tool_use"]
    results = [b for m in second["body"]["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b.get("type") == "tool_result"]
    assert [u["name"] for u in uses] == ["Read"] and uses[0]["input"] == {
        "file_path": str(notes)}
    assert len(results) == 1 and results[0]["tool_use_id"] == uses[0]["id"]
    assert SECRET in json.dumps(results[0]["content"])  # the file's content, read by Claude Code
    assert len(first["body"]["tools"]) > 20  # its default tools, offered in full


def test_codex_runs_a_command_with_its_shell_tool_and_answers(
        place: Place, notes: Path, tmp_path: Path) -> None:
    installed("codex")
    lead = scripted_lead(tmp_path, round_trip("exec_command", {"cmd": "cat notes.txt"}))
    try:
        logged = Logged(lead.lead)
        ran = codex(place, lead.url, "What does notes.txt say?")
        assert ran.rc == 0, ran
        assert ANSWER in ran.out, ran
        requests = assert_all_answered(logged, ran)
        first, second = lead.bodies()
        assert [r.path for r in requests] == ["/v1/responses"] * 2
    finally:
        lead.lead.stop()
    calls = [i for i in second["body"]["input"] if i.get("type") == "function_call"]
    outputs = [i for i in second["body"]["input"] if i.get("type") == "function_call_output"]
    assert [c["name"] for c in calls] == ["exec_command"]
    assert json.loads(calls[0]["arguments"]) == {"cmd": "cat notes.txt"}
    assert len(outputs) == 1 and outputs[0]["call_id"] == calls[0]["call_id"]
    assert SECRET in outputs[0]["output"]  # the command's output, run by Codex
    assert {t["type"] for t in first["body"]["tools"]} >= {"function", "namespace"}

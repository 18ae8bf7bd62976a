"""llama.cpp RPC (real tier): SmolLM2 on local `python -m shared.rpc` servers.

Each server serves one client at a time, so every lead or back here gets servers of its own.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest

from bench.procs import Back, Lead, Proc, free_port, metric, wait_until
from shared.wire.httpclient import sse_events
from shared.wire.rpc_endpoints import Endpoint, RpcError, hello
from tests.drafting import FORCED

pytestmark = pytest.mark.real

PROMPTS = ["Write a Python function that reverses a string.", "Name three colours.",
           "What is the capital of France? Answer in one sentence."]
ABORTED = "llama.cpp aborted: Remote RPC server crashed or returned malformed response"


def rpc_supported() -> bool:
    from shared.llama import ggml

    return ggml.rpc_supported()


if not rpc_supported():
    pytest.skip("this llama-cpp-python was built without RPC (make install builds it with "
                "RPC on)", allow_module_level=True)


class RpcServer(Proc):
    def __init__(self, cpus: str | None = None) -> None:
        self.endpoint = Endpoint("127.0.0.1", free_port())
        super().__init__(["-m", "shared.rpc", "--port", str(self.endpoint.port), "--threads",
                          "1"], None, "rpc", cpus)
        wait_until(self._answers, 30, f"the RPC server on {self.endpoint}")

    def _answers(self) -> bool:
        assert self.alive(), self.log()
        try:
            hello(self.endpoint, timeout=2)
            return True
        except RpcError:
            return False


@pytest.fixture
def servers() -> Iterator[list[RpcServer]]:
    started = [RpcServer(), RpcServer()]
    yield started
    for server in started:
        server.stop()


def serving(server: RpcServer) -> bool:
    """Whether a client holds a connection now: HELLO checks and device counts close
    theirs, a model with layers on the server keeps one open."""
    log = server.log()
    return log.count("Accepted client connection") == log.count("Client connection closed") + 1


def greedy(lead: Lead, prompt: str, n: int = 64) -> str:
    r = httpx.post(f"{lead.url}/v1/chat/completions", timeout=120, json={
        "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
        "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_a_target_split_over_two_servers_answers_as_a_local_one(
        servers: list[RpcServer]) -> None:
    # flash attention as alike as the rest: auto would turn it on for the offloaded lead
    local = Lead("smollm2-135m", "--max-draft", "0", "--flash-attn", "off")
    try:
        expected = [greedy(local, p) for p in PROMPTS]
    finally:
        local.stop()
    endpoints = ",".join(str(s.endpoint) for s in servers)
    split = Lead("smollm2-135m", "--max-draft", "0", "--rpc", endpoints, "--n-gpu-layers", "99",
                 "--tensor-split", "3,1", "--flash-attn", "off")
    try:
        assert [greedy(split, p) for p in PROMPTS] == expected
        assert all(serving(s) for s in servers), "a server holds no live connection"
    finally:
        split.stop()


def test_device_picks_among_the_rpc_servers_as_llama_server_names_them(
        servers: list[RpcServer]) -> None:
    endpoints = ",".join(str(s.endpoint) for s in servers)  # their devices: RPC0, RPC1
    args = ["-m", "lead", "-m", "smollm2-135m", "--rpc", endpoints, "-ngl", "99"]
    wrong = Proc([*args, "-dev", "CUDA9"], None, "lead-no-such-device")
    assert wrong.p.wait(60) == 1
    assert wrong.log().strip().splitlines()[-1].startswith(
        "error: --device: no device 'CUDA9' to offload to (devices: RPC0, RPC1"), wrong.log()
    lead = Lead("smollm2-135m", "--max-draft", "0", *args[4:], "-dev", "RPC1")
    try:
        greedy(lead, PROMPTS[1], 8)
        assert serving(servers[1]) and not serving(servers[0])  # the layers on RPC1 only
    finally:
        lead.stop()


def test_a_back_drafts_with_its_model_on_a_server() -> None:
    # The default pair: SmolLM2 drafting for itself through RPC is slower than its lead
    # alone, so its drafts would come too late. A fixed draft length keeps lead asking
    # where its cost model would find that one core of drafting does not pay.
    server = RpcServer(cpus="1")  # where the back drafts: lead has CPU 0
    lead = Lead("qwen2.5-coder-1.5b", *FORCED, cpus="0")
    back = Back(lead, "qwen2.5-coder-0.5b", "--rpc", str(server.endpoint), "--n-gpu-layers",
                "-1", "--cpus", "1")
    try:
        back.wait_attached(120)
        greedy(lead, PROMPTS[0], 96)
        assert metric(lead, "duo_accepted_tokens_total") > 0, back.log()[-2000:]
        assert f"all layers on RPC servers {server.endpoint}" in back.log()
    finally:
        back.stop()
        lead.stop()
        server.stop()


@pytest.mark.parametrize("role", ["lead", "back"])
def test_an_unreachable_server_is_a_one_line_error(role: str) -> None:
    port = free_port()
    args = ["-m", role, "-m", "smollm2-135m", "--rpc", f"127.0.0.1:{port}", "--n-gpu-layers",
            "99"]
    if role == "back":
        args += ["--lead", f"127.0.0.1:{free_port()}"]
    proc = Proc(args, None, f"{role}-unreachable")
    assert proc.p.wait(60) == 1
    lines = proc.log().strip().splitlines()
    assert lines[-1].startswith(f"error: cannot reach RPC server 127.0.0.1:{port}"), lines


def test_a_server_killed_mid_reply_ends_lead_with_a_clear_line(
        servers: list[RpcServer]) -> None:
    lead = Lead("smollm2-135m", "--max-draft", "0", "--rpc", str(servers[0].endpoint),
                "--n-gpu-layers", "99")
    received = 0
    try:
        with pytest.raises(httpx.HTTPError), httpx.stream(  # noqa: PT012
                "POST", f"{lead.url}/v1/chat/completions", timeout=60, json={
                    "messages": [{"role": "user", "content": "Tell a long story."}],
                    "max_tokens": 1500, "stream": True, "temperature": 0}) as r:
            for _ in sse_events(r):
                received += 1
                if received == 5:
                    servers[0].kill(signal.SIGKILL)
        assert lead.p.wait(30) == 70
        assert lead.log().strip().splitlines()[-1].endswith(ABORTED)
    finally:
        lead.stop()


def test_a_back_whose_server_dies_leaves_lead_serving(servers: list[RpcServer]) -> None:
    lead = Lead("smollm2-135m", *FORCED)  # lead asks a back for drafts on any machine
    back = Back(lead, "smollm2-135m", "--rpc", str(servers[0].endpoint), "--n-gpu-layers", "99")
    try:
        back.wait_attached()
        servers[0].kill(signal.SIGKILL)
        greedy(lead, PROMPTS[0], 64)  # the back drafts, finds its server gone, exits
        assert back.p.wait(60) == 70
        assert back.log().strip().splitlines()[-1].endswith(ABORTED)
        assert greedy(lead, PROMPTS[1], 16)
        assert httpx.get(f"{lead.url}/health", timeout=5).json()["status"] == "ok"
    finally:
        back.stop()
        lead.stop()


def test_the_overhead_benchmark_prints_both_placements() -> None:
    bench = Proc(["-m", "bench.rpc", "--model", "smollm2-135m", "--rounds", "1", "--prompts",
                  "1", "--tokens", "16"], None, "bench-rpc")
    assert bench.p.wait(300) == 0, bench.log()[-2000:]
    rows = [line for line in bench.log().splitlines() if line.startswith("| ")]
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| default: every core",
                                                         "| pinned: 1 thread on CPU 1"]
    assert all(float(row.split(" | ")[3].split("x")[0]) > 0 for row in rows[1:])

"""--workload prompt: prompt evaluation beside llama-server, as a coding agent meets it.

bench/agent.json is an agent's first request, recorded (opencode's system prompt, its ten
tools and the user's first message: 7,204 tokens of the default target's tokenizer and chat
template). Each server, started afresh for it, is sent three requests, streamed, greedy, a
few tokens each: **cold** (nothing cached), **the same again**, and **the next turn** (the
conversation, the reply and the user's next message: what the agent sends next). What is
timed is what the agent waits for: from sending a request to the first text of its reply.

Lead runs with its default flags, as a user starts it (the context it chooses: 32768 tokens
a generation for the default target); llama-server with its defaults; both get the same
model, threads and CPUs. Rounds (--repeat) alternate which goes first.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

import httpx

from bench import llamaserver
from bench.cpuwatch import LoadWatch, caveat
from bench.procs import Lead
from bench.report import write_json

WORKLOAD = "prompt"
TOKENS = 8  # a reply's first tokens: what is measured is the prompt
PHASES = ("cold", "same again", "next turn")
LEAD = "duo lead (its defaults)"
PEER = llamaserver.PLAIN
ORDER = "a fresh server per round, lead and llama-server alternating which goes first"
CONTEXT_LINES = (r"vocabulary, context (\d+);", r"n_ctx_slot = (\d+)")  # lead, llama-server
Server = Lead | llamaserver.LlamaServer


class RequestFailed(RuntimeError):
    """A server answered the request with an error (its body says why)."""


@dataclass
class Turn:
    server: str
    phase: str
    round: int
    ttft_s: float  # from sending to the first text of the reply
    prompt_tokens: int
    cached_tokens: int  # of prompt_tokens, taken from the server's cache
    text: str
    held_s: float = 0.0  # lead only: from its first token (its `duo` count) to the first text


def load() -> dict:
    """The recorded request: {"about", "messages", "tools", "next"} (the user's next message)."""
    return json.loads(resources.files("bench").joinpath("agent.json").read_text("utf-8"))


def request(messages: list[dict], tools: list[dict], tokens: int) -> dict:
    return {"messages": messages, "tools": tools, "max_tokens": tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}


def next_turn(prompt: dict, reply: str) -> list[dict]:
    """The conversation an agent sends next: the first one, the reply, the next message."""
    return [*prompt["messages"], {"role": "assistant", "content": reply},
            {"role": "user", "content": prompt["next"]}]


def ask(url: str, server: str, phase: str, round_: int, body: dict) -> Turn:
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RequestFailed(f"{server} answered {r.status_code}: {r.read()[:300].decode()}")
        return turn_of(server, phase, round_, llamaserver.stamped(r), t0)


def turn_of(server: str, phase: str, round_: int, stamped: Iterable[tuple[float, dict]],
            t0: float) -> Turn:
    """A Turn from a stream, (arrival time, event) in order: the first text's arrival (or a
    tool call's) less t0; where no text came at all, the stream's end. Lead also counts the
    tokens each event stands for, text or not (it holds text that may begin a tool call)."""
    first = last = token = None
    pieces: list[str] = []
    usage: dict = {}
    for at, event in stamped:
        last = at
        delta = (event.get("choices") or [{}])[0].get("delta") or {}
        piece = (delta.get("reasoning_content") or "") + (delta.get("content") or "")
        if first is None and (piece or delta.get("tool_calls")):
            first = at
        if token is None and (event.get("duo") or {}).get("tokens"):
            token = at
        pieces.append(piece)
        usage = event.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    shown = first if first is not None else last or t0
    return Turn(server, phase, round_, shown - t0, usage.get("prompt_tokens", 0), cached,
                "".join(pieces), shown - token if token is not None else 0.0)


def session(server: str, start: Callable[[], Server], prompt: dict, tokens: int, round_: int
            ) -> tuple[list[Turn], int | None]:
    """A fresh server's three turns (cold, the same again, the next turn), then stopped; and
    the context a generation held there, from its log."""
    proc = start()
    try:
        url = proc.url
        body = request(prompt["messages"], prompt["tools"], tokens)
        cold = ask(url, server, "cold", round_, body)
        again = ask(url, server, "same again", round_, body)
        following = ask(url, server, "next turn", round_,
                        {**body, "messages": next_turn(prompt, cold.text)})
    finally:
        proc.stop()
    return [cold, again, following], context_of(proc.log())


def context_of(log: str) -> int | None:
    """Tokens one generation held, as lead or llama-server logged it at start."""
    for pattern in CONTEXT_LINES:
        if found := re.search(pattern, log):
            return int(found.group(1))
    return None


def servers(a: argparse.Namespace, target: Path) -> dict[str, Callable[[], Server]]:
    """How to start each configuration afresh: lead with its defaults (and each
    --lead-variant), llama-server with its own; the threads, CPUs and layers the run was
    given."""
    given = [*(["--threads", str(a.lead_threads)] if a.lead_threads else []),
             *(["--cpus", a.lead_cpus] if a.lead_cpus else []),
             *(["--n-gpu-layers", str(a.lead_ngl)] if a.lead_ngl else [])]
    starts: dict[str, Callable[[], Server]] = {
        LEAD: lambda: Lead(a.target, *given, sized=False)}
    for flags in a.lead_variant:
        starts[f"duo lead, {flags}"] = lambda flags=flags: Lead(
            a.target, *given, *shlex.split(flags), sized=False)
    if a.llama_server_bin is not None:
        args = llamaserver.server_args(target, a.loop_threads, a.lead_ngl, [], ctx=None)
        starts[PEER] = lambda: llamaserver.LlamaServer(a.llama_server_bin, args, a.lead_cpus)
    return starts


def note(a: argparse.Namespace) -> str:
    if a.llama_server_bin is None:
        return llamaserver.skipped_line(a.llama_server)
    return (f"llama-server ({a.llama_server_bin}) ran with its defaults (its own context, 4 "
            "slots, unified KV cache, flash attention auto), given lead's model, threads and "
            "CPUs")


def run(a: argparse.Namespace, progress: Callable[[str], None]) -> dict:
    from shared.presets import resolve_model

    prompt = load()
    starts = servers(a, resolve_model(a.target))
    watch = LoadWatch()
    turns: list[Turn] = []
    contexts: dict[str, int | None] = {}
    for round_ in range(a.repeat):
        order = list(starts) if round_ % 2 == 0 else list(reversed(starts))
        for name in order:
            progress(f"  round {round_ + 1}/{a.repeat}: {name}, started afresh")
            got, contexts[name] = session(name, starts[name], prompt, a.tokens, round_)
            turns += got
            progress("    " + ", ".join(f"{t.phase} {t.ttft_s:.2f} s" for t in got))
    return {"turns": turns, "contexts": contexts, "foreign_cpu": watch.share(),
            "notes": [note(a)], "about": prompt["about"]}


def medians(turns: list[Turn]) -> dict[str, dict[str, float]]:
    """Per server: each phase's median time to first token over the rounds, and the cold
    prompt's tokens per second (its tokens over the median time)."""
    out: dict[str, dict[str, float]] = {}
    for t in turns:
        out.setdefault(t.server, {})
    for server, row in out.items():
        for phase in PHASES:
            mine = [t for t in turns if t.server == server and t.phase == phase]
            row[phase] = statistics.median(t.ttft_s for t in mine)
        tokens = statistics.median(t.prompt_tokens for t in turns
                                   if t.server == server and t.phase == "cold")
        row["cold tok/s"] = tokens / row["cold"] if row["cold"] else 0.0
    return out


def table(turns: list[Turn]) -> str:
    """Servers by phase, seconds to the first token, each against llama-server as a speed
    (its seconds over the server's) where it ran."""
    figures = medians(turns)
    peer = figures.get(PEER)
    lines = ["| configuration | cold: TTFT s | same again: TTFT s | next turn: TTFT s | "
             "cold: prompt tok/s | prompt tokens, cold / next turn (cached) |",
             "|---|---|---|---|---|---|"]
    for server, row in figures.items():
        cells = [_cell(row[phase], peer[phase] if peer and server != PEER else None)
                 for phase in PHASES]
        rate = f"{row['cold tok/s']:.1f}"
        if peer and server != PEER and peer["cold tok/s"]:
            rate += f" ({row['cold tok/s'] / peer['cold tok/s']:.2f}x)"
        cold, following = (next(t for t in turns if t.server == server and t.phase == phase)
                           for phase in ("cold", "next turn"))
        lines.append(f"| {server} | " + " | ".join(cells) + f" | {rate} | {cold.prompt_tokens}"
                     f" / {following.prompt_tokens} ({following.cached_tokens}) |")
    return "\n".join(lines)


def unlike(turns: list[Turn]) -> str | None:
    """A warning where the servers' templates made prompts of different lengths from the same
    request (then only tokens per second compare like with like)."""
    sizes = {t.server: t.prompt_tokens for t in turns if t.phase == "cold" and t.round == 0}
    if len(set(sizes.values())) < 2:
        return None
    return ("caveat: the servers' chat templates made prompts of different lengths from the "
            "same request (" + ", ".join(f"{name} {n}" for name, n in sizes.items()) +
            " tokens): compare tokens per second, not seconds")


def _cell(seconds: float, peer: float | None) -> str:
    if peer is None:
        return f"{seconds:.2f}"
    return f"{seconds:.2f} ({peer / seconds:.2f}x)" if seconds else f"{seconds:.2f} (-)"


def show(a: argparse.Namespace, data: dict, out: Path) -> None:
    turns: list[Turn] = data["turns"]
    print(f"\nprompt evaluation, target {a.target}: a recorded agent request ({data['about']}); "
          f"{a.tokens} tokens a reply, greedy, streamed; {a.repeat} round"
          f"{'s' * (a.repeat > 1)}, {ORDER}; medians over the rounds\n")
    print(table(turns))
    if PEER in {t.server for t in turns}:
        print("\n(Nx: llama-server's seconds over this configuration's, as a speed: above 1, "
              "faster than llama-server)")
    for line in data["notes"] + [unlike(turns) or ""]:
        if line:
            print(line)
    held = ", ".join(f"{name} {n if n else '?'}" for name, n in data["contexts"].items())
    print(f"tokens a generation held, as each logged it: {held}")
    print("\nreplies, first round:")
    for t in turns:
        if t.round == 0:
            print(f"- {t.server}, {t.phase}: {t.text!r}")
    for t in turns:  # what the first text waited for beside the prompt
        if t.held_s >= 0.1:
            print(f"{t.server}, {t.phase}, round {t.round + 1}: its first text came "
                  f"{t.held_s:.2f} s after its first token (text held while it might begin a "
                  "tool call)")
    write_json(out / "prompt.json", {
        "args": vars(a), "about": data["about"], "medians": medians(turns),
        "contexts": data["contexts"], "foreign_cpu": data["foreign_cpu"],
        "notes": data["notes"], "turns": [asdict(t) for t in turns]})
    if warning := caveat(data["foreign_cpu"]):
        print(f"\n{warning}")
    print(f"\nwrote {out}/prompt.json")

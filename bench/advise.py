"""python -m bench --advise: will duo be faster on this machine? Measured in a minute or two.

Each placement is measured in a process of its own, pinned before its model loads, with
one evaluating thread (shared/modelthread.py). Pinning the calling thread of a process
whose model has evaluated already would not move llama.cpp's OpenMP pool: its threads
kept both CPUs when the caller was pinned to one. Three processes, in turn:

1. every core: the target's greedy replies to a few prompts, its verify seconds per batch
   size, then the draft's seconds per token and, reading each reply in one batch, whether
   its greedy token is the target's at every position;
2. lead's share of the cores (the first half, or --lead-cpus): the target's one-token
   step alone, then its verify seconds per batch size while
3. a draft process on the other cores (or --back-cpus) drafts without pause, timing its
   own tokens.

`bench.advice` then prices each placement.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import numpy as np

from bench import advice, llamaserver, prompts
from bench.cpuwatch import LoadWatch, caveat
from shared.placement import allowed_cpus, format_cpus, parse_cpus

N_CTX = 2048
ADVISE_PROMPTS = 4  # one of each kind and one more: the replies take most of the time
_SPAWN = multiprocessing.get_context("spawn")  # a fresh process: no pool, no pinning yet


class AdviseError(RuntimeError):
    pass


@dataclass(frozen=True)
class Loader:
    """Loads a model where it is called (in the measuring process, once it is pinned)."""

    path: Path
    threads: int
    n_gpu_layers: int = 0

    def __call__(self) -> Any:
        from shared.llama.model import LlamaModel

        return LlamaModel(self.path, self.threads, self.n_gpu_layers, N_CTX)


def run(a: argparse.Namespace, progress: Callable[[str], None]) -> None:
    from lead.server.settings import LeadSettings
    from shared.presets import resolve_model

    started, watch = time.monotonic(), LoadWatch()
    allowed = allowed_cpus()
    split = split_cpus(a, allowed)
    chosen = prompts.spread(prompts.load(a.workload), a.prompts)
    max_draft = LeadSettings().max_draft
    sizes = list(range(1, max_draft + 2))
    target, draft = resolve_model(a.target), resolve_model(a.draft)
    progress(f"advise: {a.target} + {a.draft} on {len(allowed)} CPUs, {len(chosen)} prompts x "
             f"{a.tokens} tokens; each placement is measured in a process of its own")
    every = _result(*_start(None, every_core, Loader(target, len(allowed), a.lead_ngl),
                            Loader(draft, len(allowed), a.back_ngl),
                            [p["text"] for p in chosen], a.tokens, sizes),
                    "the every-core measurement")
    shared_cpu = None
    if split is not None:
        progress(f"split: target on {advice.cpus(split[0])} alone, then beside the draft "
                 f"drafting on {advice.cpus(split[1])}")
        shared_cpu = measure_split(a, split, target, draft, every["ids"][0], sizes)
    agrees = [x for reply in every["agrees"] for x in reply]
    measured = advice.Measured(every["costs"], len(allowed), float(np.mean(agrees or [0.0])),
                               every["draft_s"], max_draft, shared_cpu)
    print(f"\npython -m bench --advise: target {a.target}, draft {a.draft}; measured in "
          f"{time.monotonic() - started:.0f} s\n")
    print(advice.report(measured, len(chosen), len(agrees)))
    print(llamaserver.advice_line(a.llama_server_bin))
    note = caveat(watch.share())
    if note:
        print(note)


def split_cpus(a: argparse.Namespace, allowed: frozenset[int]) -> tuple[str, str] | None:
    """(lead's CPUs, the back's) when this CPU is shared: --lead-cpus/--back-cpus (parse
    checked them), else the first half and the rest, as `make run` places them; None on
    one CPU."""
    ordered = sorted(allowed)
    lead = parse_cpus(a.lead_cpus) if a.lead_cpus else frozenset(ordered[:len(ordered) // 2])
    back = parse_cpus(a.back_cpus) if a.back_cpus else allowed - lead
    return (format_cpus(lead), format_cpus(back)) if lead and back else None


def measure_split(a: argparse.Namespace, split: tuple[str, str], target: Path, draft: Path,
                  prompt_ids: list[int], sizes: list[int]) -> advice.Split:
    lead_cpus, back_cpus = parse_cpus(split[0]), parse_cpus(split[1])
    alone, drafting, done = _SPAWN.Event(), _SPAWN.Event(), _SPAWN.Event()
    lead = _start(lead_cpus, lead_share, Loader(target, a.lead_threads or len(lead_cpus),
                                                a.lead_ngl), prompt_ids, sizes, alone,
                  drafting, done)
    _wait_for(alone, lead, "the target on lead's CPUs")
    back = _start(back_cpus, back_share, Loader(draft, a.back_threads or len(back_cpus),
                                                a.back_ngl), prompt_ids, drafting, done)
    draft_s = _result(*back, "the draft on the back's CPUs")
    quiet_s, busy = _result(*lead, "the target on lead's CPUs")
    return advice.Split(split[0], split[1], quiet_s, busy, draft_s)


# --- in the measuring processes ---
def every_core(load_target: Callable[[], Any], load_draft: Callable[[], Any], texts: list[str],
               tokens: int, sizes: list[int]) -> dict[str, Any]:
    """Prompt ids, the target's greedy replies and verify costs, the draft's agreement with
    those replies and its seconds per token: all on every core."""
    from bench.peers import agreement

    target = load_target()
    try:
        ids = [chat_ids(target, text) for text in texts]
        replies = []
        for i, prompt_ids in enumerate(ids):
            t0 = time.perf_counter()
            replies.append(greedy_reply(target, prompt_ids, tokens))
            _say(f"  every core: target reply {i + 1}/{len(ids)}, {len(replies[-1])} tokens "
                 f"in {time.perf_counter() - t0:.1f} s")
        costs = step_costs(target, ids[0], sizes)
        _say(f"  every core: target verify cost b=1..{max(sizes)} measured")
        table = (target.n_vocab, target.fingerprint())
    finally:
        target.close()
    draft = load_draft()
    try:
        if (draft.n_vocab, draft.fingerprint()) != table:
            raise AdviseError("the draft has another token table than the target: a back "
                              "could not draft for this lead")
        agrees = [agreement(draft, p, reply) for p, reply in zip(ids, replies, strict=True)]
        draft_s = step_costs(draft, ids[0], [1])[1]
    finally:
        draft.close()
    _say("  every core: draft agreement and cost measured")
    return {"ids": ids, "costs": costs, "agrees": agrees, "draft_s": draft_s}


def lead_share(load: Callable[[], Any], prompt_ids: list[int], sizes: list[int], alone: Event,
               drafting: Event, done: Event) -> tuple[float, dict[int, float]]:
    """(one-token step with nothing beside, verify seconds per batch size while the draft
    drafts on the other cores)."""
    target = load()
    try:
        quiet = step_costs(target, prompt_ids, [1])[1]
        alone.set()
        if not drafting.wait(300):
            raise AdviseError("the draft process did not start drafting within 300 s")
        return quiet, step_costs(target, prompt_ids, sizes)
    finally:
        done.set()
        target.close()


def back_share(load: Callable[[], Any], prompt_ids: list[int], drafting: Event, done: Event,
               limit_s: float = 300.0) -> float:
    """Median seconds per draft token, drafting greedily without pause until `done` (one
    token at least)."""
    from shared.model import sync_cache

    draft = load()
    try:
        sync_cache(draft, prompt_ids)
        base, token, times = len(draft.cached), prompt_ids[-1], []
        drafting.set()
        deadline = time.monotonic() + limit_s
        while not times or (not done.is_set() and time.monotonic() < deadline):
            t0 = time.perf_counter()
            token = int(np.argmax(draft.evaluate([token], 1)[-1]))
            times.append(time.perf_counter() - t0)
            if len(draft.cached) >= base + 64:  # a draft's length, then start over
                draft.truncate(base)
        return float(np.median(times))
    finally:
        draft.close()


def step_costs(model: Any, prompt_ids: list[int], sizes: list[int], passes: int = 4,
               one_token: int = 9) -> dict[int, float]:
    """Seconds to evaluate b tokens (logits for all b) after the prompt: the fastest of
    `passes` passes over every size, and of `one_token` for b=1, the figure every other is
    divided by. Other work on the machine only ever adds time, and a burst of it lands on
    one pass of several sizes, not on every repeat of one."""
    from shared.model import sync_cache

    sync_cache(model, prompt_ids)
    base = len(model.cached)
    filler = prompt_ids[-1:] * max(sizes)
    best = dict.fromkeys(sizes, float("inf"))
    rounds = [sizes] * passes + [[1]] * max(one_token - passes, 0)
    for pass_sizes in rounds:
        for b in pass_sizes:
            t0 = time.perf_counter()
            model.evaluate(filler[:b], b)
            best[b] = min(best[b], time.perf_counter() - t0)
            model.truncate(base)
    return best


def chat_ids(model: Any, text: str) -> list[int]:
    return model.tokenize(model.format_chat([{"role": "user", "content": text}]),
                          special=True, add_bos=False)


def greedy_reply(model: Any, prompt_ids: list[int], n: int) -> list[int]:
    """The target's greedy continuation, up to n tokens or its end of generation."""
    model.truncate(0)
    row = model.evaluate(prompt_ids, 1)[-1]
    out: list[int] = []
    while len(out) < n:
        out.append(int(np.argmax(row)))
        if out[-1] in model.eos_token_ids or len(out) == n:
            break
        row = model.evaluate([out[-1]], 1)[-1]
    return out


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- processes ---
def _start(cpus: frozenset[int] | None, fn: Callable[..., Any], *args: Any
           ) -> tuple[BaseProcess, Connection]:
    receive, send = _SPAWN.Pipe(duplex=False)
    proc = _SPAWN.Process(target=_pinned_call, args=(cpus, fn, args, send), daemon=True)
    proc.start()
    send.close()
    return proc, receive


def _pinned_call(cpus: frozenset[int] | None, fn: Callable[..., Any], args: tuple,
                 send: Connection) -> None:
    if cpus:  # before any model loads: the threads it starts inherit this
        os.sched_setaffinity(0, cpus)
    try:
        send.send((True, fn(*args)))
    except Exception as exc:  # the parent reports it, with what was being measured
        send.send((False, f"{type(exc).__name__}: {exc}"))


def _result(proc: BaseProcess, receive: Connection, what: str, timeout: float = 600) -> Any:
    if not receive.poll(timeout):
        proc.kill()
        raise AdviseError(f"{what} took longer than {timeout:.0f} s")
    try:
        ok, value = receive.recv()
    except EOFError:
        proc.join(5)
        raise AdviseError(f"{what} ended without an answer (exit code {proc.exitcode})") from None
    proc.join(30)
    if not ok:
        raise AdviseError(f"{what}: {value}")
    return value


def _wait_for(event: Event, child: tuple[BaseProcess, Connection], what: str,
              timeout: float = 600) -> None:
    """Until the child sets `event`; its own error if it ends first."""
    deadline = time.monotonic() + timeout
    while not event.wait(0.1):
        if child[1].poll(0) or not child[0].is_alive():
            _result(*child, what)  # raises the error it sent, if it sent one
            raise AdviseError(f"{what} ended before it measured")
        if time.monotonic() > deadline:
            child[0].kill()
            raise AdviseError(f"{what} took longer than {timeout:.0f} s")

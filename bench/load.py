"""python -m bench.load: several clients at once, duo beside llama.cpp's llama-server.

At each level (1, 2, 4, 8 clients by default) every client sends one request at the same
moment (a bench prompt each, or with --workload edit a whole file to edit; greedy,
streamed); per configuration it prints the aggregate decode rate (all tokens over the wall
time from the first send to the last token), that rate over the server's own prefill rate
(measured first: what verifying drafted tokens in batches could reach at most), and the
median and 95th percentile of time to first token and of a request's whole latency. The
configurations (lead, llama-server plain and with its n-gram drafts, --spec-default, four
slots each) are interleaved level by level, their order flipped each round. Then a short
request is sent while a long reply runs, and its latency set against its latency alone.

With --sim the same runs over simulated models (lead alone against lead + back, the
GPU-like prices of `python -m bench --sim`): drafts for every session, and their gain
beside the bound with free drafts at the acceptance measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx

from bench import prompts as prompt_sets
from bench.cpuwatch import LoadWatch, caveat
from bench.llamaserver import PLAIN, SPEC_DEFAULT
from bench.procs import Lead, SimBack, SimLead
from shared.wire.httpclient import asse_events

LONG_TOKENS, SHORT_TOKENS = 400, 16
WARM_UP = "Say hello."  # no bench prompt: none of them is cached by it
SIM_TARGET = (0.03, 0.0005)  # seconds per call, per token: bench --sim's GPU-like target
SIM_AGREE = 0.8
SIM_NAMES = ("SIM lead alone", "SIM duo: lead + back")
# Once the prompts run out (15 requests a round over 8 bench prompts), they are asked again:
# each server as its users start it, so lead drafts them from its memory of replies and
# --spec-default from its n-gram pool; round 1 alone is new prompts to every server.
REPEATS = "each server with its defaults: a prompt sent again may be drafted from its reply before"


@dataclass(frozen=True)
class Sample:
    """One request as its client saw it."""

    config: str
    clients: int
    tokens: int
    ttft_s: float  # from sending to the first text
    latency_s: float  # from sending to the last event
    sent: float
    done: float
    drafted: int = 0
    accepted: int = 0
    round: int = 0


async def request(http: httpx.AsyncClient, config: str, clients: int, text: str,
                  tokens: int, started: asyncio.Event | None = None) -> Sample:
    """One streamed reply; `started` is set when its first text arrives."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first, usage = None, {}
    async with http.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{config} answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for event in asse_events(r):
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if first is None and delta.get("content"):
                first = time.perf_counter()
                if started is not None:
                    started.set()
            usage = event.get("usage") or usage
    done = time.perf_counter()
    return Sample(config, clients, int(usage.get("completion_tokens", 0)),
                  (first or done) - sent, done - sent, sent, done,
                  int(usage.get("drafted_tokens", 0)), int(usage.get("accepted_tokens", 0)))


async def prefill_rate(http: httpx.AsyncClient, text: str,
                       clock: Callable[[], float] = time.perf_counter) -> float:
    """Prompt tokens a second evaluating `text` (one reply token asked): never sent before,
    so evaluated whole."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1,
            "temperature": 0}
    sent = clock()
    r = await http.post("/v1/chat/completions", json=body)
    r.raise_for_status()
    return int(r.json()["usage"]["prompt_tokens"]) / (clock() - sent)


async def prefill_rates(urls: dict[str, str], text: str) -> dict[str, float]:
    rates = {}
    for name, url in urls.items():  # one at a time: each alone on the CPUs
        async with httpx.AsyncClient(base_url=url, timeout=1800) as http:
            rates[name] = await prefill_rate(http, text)
    return rates


async def level(url: str, config: str, texts: Sequence[str], tokens: int) -> list[Sample]:
    """All `texts` sent at once, one client each."""
    async with httpx.AsyncClient(base_url=url, timeout=1800) as http:
        return list(await asyncio.gather(*(request(http, config, len(texts), t, tokens)
                                           for t in texts)))


def sent(texts: Sequence[str], levels: Sequence[int], round_: int, n: int) -> list[str]:
    """Level n's prompts in round `round_`: the next n of `texts`, taken in turn over the
    rounds and levels, so no prompt is sent twice while there are new ones (a server that
    drafts from earlier replies would copy the reply to a prompt sent again)."""
    start = round_ * sum(levels) + sum(levels[:levels.index(n)])
    return [texts[(start + i) % len(texts)] for i in range(n)]


def long_prompts(texts: list[str], sim: bool) -> list[str]:
    """The long replies' prompts, round r taking [r % len]: whole files to edit; with
    simulated models (their text is one token a character, files too long for their
    context) bench prompts, never round r's short one (texts[r % len]): the back would
    draft the short one, asked during the same prompt's long reply, on a fresh slot."""
    if sim:
        return texts[len(texts) // 2:] + texts[:len(texts) // 2]
    return [p["text"] for p in prompt_sets.load("edit")]


async def short_during_long(url: str, config: str, long_text: str, short_text: str
                            ) -> tuple[float, float]:
    """A short reply's latency alone, then while a long reply runs (sent once the long
    one's first text has come)."""
    async with httpx.AsyncClient(base_url=url, timeout=1800) as http:
        alone = await request(http, config, 1, short_text, SHORT_TOKENS)
        started = asyncio.Event()
        long_task = asyncio.create_task(request(http, config, 2, long_text, LONG_TOKENS,
                                                started))
        await asyncio.wait([long_task, asyncio.ensure_future(started.wait())],
                           return_when=asyncio.FIRST_COMPLETED)
        if long_task.done():
            long_task.result()  # its error, if it failed before its first text
        during = await request(http, config, 2, short_text, SHORT_TOKENS)
        await long_task
    return alone.latency_s, during.latency_s


def summary(samples: list[Sample]) -> dict[str, float]:
    """Aggregate tok/s (each round's tokens over its wall time, pooled over the rounds),
    and the latencies' p50/p95."""
    rounds = {s.round for s in samples}
    wall = sum(max(s.done for s in samples if s.round == r) -
               min(s.sent for s in samples if s.round == r) for r in rounds)
    tokens = sum(s.tokens for s in samples)
    return {"tok_s": tokens / wall if wall > 0 else 0.0,
            "ttft_p50": _pct(samples, "ttft_s", 50), "ttft_p95": _pct(samples, "ttft_s", 95),
            "lat_p50": _pct(samples, "latency_s", 50), "lat_p95": _pct(samples, "latency_s", 95),
            "drafted": sum(s.drafted for s in samples),
            "accepted": sum(s.accepted for s in samples)}


def free_draft_bound(sessions: int, alpha: float, price: tuple[float, float],
                     most: int = 8) -> float:
    """The most drafts could give `sessions` decoding together, were drafting free: each
    drafts k tokens, each right with `alpha` given the ones before, and a step of b tokens
    costs price[0] + price[1] * b; over plain decoding of them all."""
    call, per_token = price

    def rate(k: int) -> float:
        expected = (1 - alpha ** (k + 1)) / (1 - alpha)
        return sessions * expected / (call + per_token * sessions * (k + 1))
    return max(rate(k) for k in range(most + 1)) / rate(0)


def _peer(names: Sequence[str]) -> str | None:
    """The peer every figure is set against: llama-server with its n-gram drafts where it
    ran (what a user of llama-server would run), else plain."""
    peers = [name for name in names if name.startswith("peer")]
    return SPEC_DEFAULT if SPEC_DEFAULT in peers else next(iter(peers), None)


def _pct(samples: list[Sample], field: str, q: int) -> float:
    values = sorted(getattr(s, field) for s in samples)
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def start(a: argparse.Namespace, stack: ExitStack) -> dict[str, str]:
    """Every configuration's URL, its server up for the whole run."""
    if a.sim:
        alone, duo = SimLead(None, *a.sim_lead), SimLead(None, *a.sim_lead)
        stack.callback(alone.stop)
        stack.callback(duo.stop)
        back = SimBack(duo, *a.sim_back)
        stack.callback(back.stop)
        back.wait_attached()
        return dict(zip(SIM_NAMES, (alone.url, duo.url), strict=True))
    urls: dict[str, str] = {}
    # the default lead, then each --lead-variant: a setting tried beside it, interleaved
    for name, flags in [("duo lead (its defaults)", "")] + \
            [(f"duo lead, {f}", f) for f in a.lead_variant]:
        lead = Lead(a.target, "--threads", str(a.threads), "--ctx-size", str(a.ctx),
                    *shlex.split(flags))
        stack.callback(lead.stop)
        urls[name] = lead.url
    if a.llama_server_bin is not None:
        from bench.llamaserver import LlamaServer, server_args
        from shared.presets import resolve_model

        for name, extra in ((PLAIN, []), (SPEC_DEFAULT, ["--spec-default"])):
            server = LlamaServer(a.llama_server_bin, server_args(  # 4 slots: 4 requests' room
                resolve_model(a.target), a.threads, 0, ["-np", "4", *extra], 4 * a.ctx))
            stack.callback(server.stop)
            urls[name] = server.url
    return urls


PROBE = "(A prompt evaluated once, to time it.) "  # a prefix no other request has


def run(a: argparse.Namespace) -> dict:
    shorts = [p["text"] for p in prompt_sets.load("bench")]
    texts = [p["text"] for p in prompt_sets.load(a.workload)]
    edits = long_prompts(shorts, a.sim)
    results: dict[str, dict[int, list[Sample]]] = {}
    latencies: dict[str, list[tuple[float, float]]] = {}
    with ExitStack() as stack:
        urls = start(a, stack)
        for url in urls.values():  # a server's first reply pages its weights in: not counted
            asyncio.run(level(url, "warm-up", [WARM_UP], SHORT_TOKENS))
        prefill = asyncio.run(prefill_rates(urls, PROBE + "\n\n".join(shorts)))
        print("  prefill tok/s: " + ", ".join(f"{n} {r:.0f}" for n, r in prefill.items()),
              flush=True)
        watch = LoadWatch()
        for round_ in range(a.repeat):
            for n in a.levels:
                order = list(urls) if (round_ + n) % 2 == 0 else list(reversed(urls))
                for name in order:
                    chosen = sent(texts, a.levels, round_, n)
                    got = [replace(s, round=round_) for s in
                           asyncio.run(level(urls[name], name, chosen, a.tokens))]
                    results.setdefault(name, {}).setdefault(n, []).extend(got)
                    print(f"  round {round_ + 1}, {n} client{'s' * (n > 1)}, {name}: "
                          f"{summary(got)['tok_s']:.1f} tok/s", flush=True)
            for name in urls:
                pair = asyncio.run(short_during_long(urls[name], name, edits[round_ % len(edits)],
                                                     shorts[round_ % len(shorts)]))
                latencies.setdefault(name, []).append(pair)
        foreign = watch.share()
    return {"results": results, "latencies": latencies, "foreign_cpu": foreign,
            "prefill": prefill}


def report(a: argparse.Namespace, data: dict) -> str:
    results, prefill = data["results"], data.get("prefill", {})
    names = sorted(results, key=lambda name: name.startswith("peer"))  # duo first
    peer = _peer(names)
    lines = [f"{a.workload} workload, up to {a.tokens}-token greedy streamed replies, all "
             f"clients at once; {a.repeat} round{'s' * (a.repeat > 1)}; {REPEATS}", "",
             "| clients | configuration | aggregate tok/s | vs " + (peer or "-") +
             " | of its prefill rate | TTFT p50 / p95 s | latency p50 / p95 s "
             "| accepted / drafted |", "|---|---|---|---|---|---|---|---|"]
    for n in a.levels:
        sums = {name: summary(results[name][n]) for name in names}
        for name in names:
            s = sums[name]
            ratio = f"{s['tok_s'] / sums[peer]['tok_s']:.2f}x" if peer and sums[peer]['tok_s'] \
                else "-"
            limit = f"{s['tok_s'] / prefill[name]:.2f}" if prefill.get(name) else "-"
            lines.append(f"| {n} | {name} | {s['tok_s']:.1f} | {ratio} | {limit} | "
                         f"{s['ttft_p50']:.2f} / "
                         f"{s['ttft_p95']:.2f} | {s['lat_p50']:.2f} / {s['lat_p95']:.2f} | "
                         f"{s['accepted']} / {s['drafted']} |")
    if a.sim:
        lines += ["", "SIMULATION: duo's gain over lead alone, beside the bound with free "
                  f"drafts (per-token agreement {SIM_AGREE}, drafts up to 8 tokens, the "
                  "simulated target's prices):", ""]
        for n in a.levels:
            alone, duo = (summary(results[name][n])["tok_s"] for name in SIM_NAMES)
            gain = duo / alone
            lines.append(f"- {n} client{'s' * (n > 1)}: {gain:.2f}x (bound "
                         f"{free_draft_bound(n, SIM_AGREE, SIM_TARGET):.2f}x)")
    lines += ["", f"A short request ({SHORT_TOKENS} tokens) sent while a long reply "
              f"({LONG_TOKENS} tokens) runs, against its latency alone:", ""]
    for name, pairs in data["latencies"].items():
        alone = statistics.median(p[0] for p in pairs)
        during = statistics.median(p[1] for p in pairs)
        lines.append(f"- {name}: {during:.2f} s during, {alone:.2f} s alone "
                     f"({during / alone:.2f}x)")
    notes = [n for n in (_pool_note(a, names), caveat(data.get("foreign_cpu"))) if n]
    return "\n".join(lines + notes)


def _pool_note(a: argparse.Namespace, names: Sequence[str]) -> str | None:
    """Where prompts are sent again, which servers may draft a reply from the one before."""
    if a.repeat * sum(a.levels) <= len(prompt_sets.load(a.workload)):
        return None
    spec = f" and {SPEC_DEFAULT} (one n-gram pool for all requests)" \
        if SPEC_DEFAULT in names else ""
    return (f"\nnote: prompts were sent again; lead (its memory of replies){spec} may draft "
            "the reply to one from the reply before (the per-round lines above show the "
            "first round, new prompts only, apart)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from bench.llamaserver import BinaryError, find_binary, skipped_line

    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b", help="preset name or GGUF path")
    p.add_argument("--workload", choices=("bench", "edit"), default="bench",
                   help="bench: bench/prompts.json; edit: bench/edits.json, whole files to "
                   "edit, the file asked back")
    p.add_argument("--levels", default=None, help="clients at once, per level (default: "
                   "1,2,4,8; --workload edit: 1,4)")
    p.add_argument("--tokens", type=int, default=None, help="tokens per reply (default: 128; "
                   f"--workload edit: {prompt_sets.EDIT_TOKENS}, the longest file)")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the levels")
    p.add_argument("--threads", type=int, default=0, help="lead's and llama-server's threads "
                   "(0: one per CPU)")
    p.add_argument("--ctx", type=int, default=4096, help="context of one request, as lead's "
                   "--ctx-size (llama-server gets --parallel times as much: 4 slots)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="llama.cpp's llama-server (default: on PATH, else skipped)")
    p.add_argument("--sim", action="store_true", help="SIMULATION: fake models, GPU-like "
                   "prices (bench --sim's), lead alone against lead + back")
    p.add_argument("--lead-variant", action="append", default=[], metavar="FLAGS",
                   help="also run a lead with these extra flags beside the default one "
                   "(repeatable; e.g. --lead-variant='--flash-attn on')")
    p.add_argument("--out", default="bench-results", help="folder for load.json")
    a = p.parse_args(argv)
    edit = a.workload == "edit"
    a.levels = [int(x) for x in (a.levels or ("1,4" if edit else "1,2,4,8")).split(",") if x]
    a.tokens = a.tokens or (prompt_sets.EDIT_TOKENS if edit else 128)
    if edit and a.sim:
        p.error("--workload edit: real models only (the simulation's text is a token a "
                "character: the files would not fit its context)")
    a.threads = a.threads or len(__import__("os").sched_getaffinity(0))
    a.sim_lead = ["--call-s", str(SIM_TARGET[0]), "--token-s", str(SIM_TARGET[1]),
                  "--parallel", str(max(a.levels))]
    a.sim_back = ["--agree", str(SIM_AGREE), "--call-s", "0.003", "--slots", str(max(a.levels))]
    try:
        a.llama_server_bin = None if a.sim else find_binary(a.llama_server)
    except BinaryError as exc:
        p.error(str(exc))
    if not a.sim and a.llama_server_bin is None:
        print(skipped_line(a.llama_server))
    return a


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    data = run(a)
    text = report(a, data)
    print("\n" + text)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    serial = {"results": {name: {n: [asdict(s) for s in ss] for n, ss in by.items()}
                          for name, by in data["results"].items()},
              "latencies": data["latencies"], "foreign_cpu": data["foreign_cpu"],
              "prefill": data["prefill"]}
    (out / "load.json").write_text(json.dumps(serial, indent=1))


if __name__ == "__main__":
    main()

"""python -m bench.rpc: what llama.cpp RPC costs per token on this machine.

Lead alone against lead with every layer on a local RPC server, the same compute threads
on the same CPUs, interleaved (A, B, A, B ...) so drift hits both alike; lead's own clock
times the decode (not streamed). Two placements: the default one (every core, unpinned)
and a pinned one (compute on CPU 1, one thread; with RPC, lead's process on CPU 0).
"""

from __future__ import annotations

import argparse
import statistics
import sys

from bench.cpuwatch import LoadWatch, caveat
from bench.procs import Lead, Proc, free_port, wait_until
from bench.prompts import load, spread
from bench.runs import via_lead
from shared.wire.rpc_endpoints import Endpoint, RpcError, hello


def rpc_server(threads: int, cpus: str | None) -> tuple[Proc, str]:
    endpoint = Endpoint("127.0.0.1", free_port())
    server = Proc(["-m", "shared.rpc", "--port", str(endpoint.port), "--threads",
                   str(threads)], None, "rpc", cpus)
    wait_until(lambda: _answers(server, endpoint), 30, f"the RPC server on {endpoint}")
    return server, str(endpoint)


def _answers(server: Proc, endpoint: Endpoint) -> bool:
    assert server.alive(), server.log()
    try:
        hello(endpoint, timeout=2)
        return True
    except RpcError:
        return False


def tok_s(model: str, threads: int, cpus: str | None, rpc: bool, prompts: list[str],
          n: int) -> float:
    """Decode tok/s over `prompts` (lead's clock), lead alone or its layers on RPC."""
    server, endpoint = rpc_server(threads, cpus) if rpc else (None, "")
    extra = ["--rpc", endpoint, "--n-gpu-layers", "-1"] if rpc else []
    lead_cpus = ("0" if cpus else None) if rpc else cpus
    lead = Lead(model, "--max-draft", "0", "--threads", str(threads), *extra, cpus=lead_cpus)
    try:
        results = [via_lead("rpc" if rpc else "local", lead, i, p, n, stream=False)
                   for i, p in enumerate(prompts)]
    finally:
        lead.stop()
        if server:
            server.stop()
    return sum(r.tokens - 1 for r in results) / sum(r.decode_s for r in results)


def compare(model: str, threads: int, cpus: str | None, rounds: int, prompts: list[str],
            n: int) -> tuple[float, float, list[float]]:
    local, remote = [], []
    for _ in range(rounds):
        local.append(tok_s(model, threads, cpus, False, prompts, n))
        remote.append(tok_s(model, threads, cpus, True, prompts, n))
    ratios = [r / lo for r, lo in zip(remote, local, strict=True)]
    return statistics.median(local), statistics.median(remote), ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.rpc", description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="target preset or path")
    parser.add_argument("--tokens", type=int, default=96, help="tokens per reply")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved A/B rounds")
    args = parser.parse_args(argv)
    prompts = [p["text"] for p in spread(load(), args.prompts)]
    watch = LoadWatch()
    print("| placement | lead alone tok/s | lead, layers on RPC tok/s | RPC / alone "
          "(each round) |\n|---|---|---|---|")
    for name, threads, cpus in (("default: every core", 0, None),
                                ("pinned: 1 thread on CPU 1", 1, "1")):
        local, remote, ratios = compare(args.model, threads, cpus, args.rounds, prompts,
                                        args.tokens)
        each = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"| {name} | {local:.1f} | {remote:.1f} | {remote / local:.2f}x ({each}) |",
              flush=True)
    print(caveat(watch.share()) or "quiet: others used <= 5 % of the CPU time during the run")


if __name__ == "__main__":
    main(sys.argv[1:])

"""python -m device.serve: lead with the target on the device, a back on the CPU cores, one
long chat reply during which the back is killed (SIGKILL) and started again; then plain
llama-server on the same GGUF, for its decode speed beside lead's.

The back drafts with the target's own GGUF (random weights: a different model would agree
with the target nowhere), so its drafts agree wherever the CPU's arithmetic and the GPU's
pick the same token: accepted tokens show the accept path working on the device. What a
real draft costs is priced by python -m device.measure.

Checks: the back is killed mid-reply (once lead has verified drafts of it), the reply ends
at max_tokens, the second back attached before the reply ended, drafts were posted and
verified before the kill and posted after the restart, some were accepted, lead and the
second back are alive at the end. Every wait is on a condition, with a timeout.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.procs import Proc, free_port, metrics, wait_until

NO_EOS = {"151643": -100, "151645": -100}  # the Qwen tokenizer's end tokens: never stop early
PROMPT = "Write a long story about a lighthouse keeper, in many chapters."


@dataclass
class Stream:
    """A streamed reply as it arrives: (seconds since sending, events so far) per event."""

    events: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    usage: dict = field(default_factory=dict)
    finish: str | None = None
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait_events(self, n: int, timeout: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: len(self.events) >= n or self.done.is_set(),
                                         timeout)


def read_stream(url: str, max_tokens: int, s: Stream, timeout: float) -> None:
    """POST a streamed chat request; fill `s` as events arrive (run on a thread)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "logit_bias": NO_EOS,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body,
                          timeout=timeout) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                _take(json.loads(line[6:]), s, time.monotonic() - t0)
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        s.error = f"{type(exc).__name__}: {exc}"
    finally:
        s.done.set()
        with s.arrived:
            s.arrived.notify_all()


def _take(chunk: dict, s: Stream, at: float) -> None:
    if chunk.get("usage"):
        s.usage = chunk["usage"]
    for choice in chunk.get("choices", []):
        if choice.get("finish_reason"):
            s.finish = choice["finish_reason"]
        text = (choice.get("delta") or {}).get("content")
        if text:
            with s.arrived:
                s.events.append(at)
                s.text.append(text)
                s.arrived.notify_all()


def decode_rate(s: Stream) -> float:
    """Tokens per second from the first event to the last."""
    tokens = s.usage.get("completion_tokens", len(s.events))
    span = s.events[-1] - s.events[0] if len(s.events) > 1 else 0.0
    return (tokens - 1) / span if span > 0 else 0.0


def counters(lead: Proc) -> dict[str, float]:
    """lead's counters and its slot 0's gauges, by short name."""
    wanted = ("draft_posts_total", "drafted_tokens_total", "accepted_tokens_total",
              "generated_tokens_total", "backs_active")
    found = metrics(lead)
    out = {k: found.get(f"duo_{k}", 0.0) for k in wanted}
    out["slot_drafted"] = found.get('duo_slot_drafted{slot="0"}', 0.0)
    out["slot_accepted"] = found.get('duo_slot_accepted{slot="0"}', 0.0)
    return out


class Roles:
    """Starts lead and backs with the check's placement."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.port = free_port()

    def lead(self) -> Proc:
        a = self.a
        extra = ["--verify-cost", a.verify_cost] if a.verify_cost else []
        extra += ["--draft-len", str(a.draft_len)] if a.draft_len else []
        p = Proc(["-m", "lead", "-m", a.target, "--host", "127.0.0.1", "--port", str(self.port),
                  "--n-gpu-layers", str(a.ngl), "--cpus", a.lead_cpus, "--ctx-size",
                  str(a.ctx), "--parallel", "1", "--no-ngram", *extra], None, "lead")
        p.url = p.wait_serving("lead", self.port, a.start_timeout)  # type: ignore[attr-defined]
        return p

    def back(self) -> Proc:
        a = self.a
        return Proc(["-m", "back", "--lead", f"127.0.0.1:{self.port}", "-m", a.back_model,
                     "--cpus", a.back_cpus, "--n-gpu-layers", "0"],
                    None, "back")


def attached(back: Proc, times: int = 1) -> bool:
    if not back.alive():
        raise AssertionError(f"back exited: {back.log()[-500:]}")
    return back.log().count("attached to lead") >= times


def serve(a: argparse.Namespace) -> dict:
    roles, out = Roles(a), {"checks": {}}
    procs: list[Proc] = []
    try:
        t0 = time.monotonic()
        lead = roles.lead()
        out["lead_start_s"] = time.monotonic() - t0
        procs.append(lead)
        alone = Stream()
        read_stream(lead.url, a.alone_tokens, alone, a.reply_timeout)  # type: ignore[attr-defined]
        out["lead_alone_tok_s"] = decode_rate(alone)
        out["lead_alone_tokens"] = alone.usage.get("completion_tokens")
        back = roles.back()
        procs.append(back)
        t1 = time.monotonic()
        wait_until(lambda: attached(back), a.start_timeout, "the back to attach")
        out["back_start_s"] = time.monotonic() - t1
        out |= reply_with_restart(a, roles, lead, back, procs)
    except (AssertionError, httpx.HTTPError, OSError) as exc:  # a wait timed out, a process died
        out["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        out["exited_log"] = getattr(exc, "log", None)  # a process that died at start
        out["checks"] = {**out.get("checks", {}), "ran to the end": False}
    finally:
        for p in reversed(procs):
            p.stop()
        out["logs"] = {Path(p.log_path).name: p.log()[-3000:] for p in procs}
    return out


def poll(predicate: Callable[[], bool], timeout: float, every: float = 0.1) -> bool:
    """Whether the condition came true within the timeout (checked every `every` s: each
    check here scrapes lead's /metrics, which costs lead a little)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(every)
    return True


def reply_with_restart(a: argparse.Namespace, roles: Roles, lead: Proc, back: Proc,
                       procs: list[Proc]) -> dict:
    """One long reply: the back is killed once lead has verified drafts of it (or after
    `kill_wait` seconds without), a second back is started and awaited, the reply read to
    its end."""
    s = Stream()
    reader = threading.Thread(target=read_stream, args=(lead.url, a.max_tokens, s,  # type: ignore[attr-defined]
                                                        a.reply_timeout), daemon=True)
    reader.start()
    s.wait_events(1, a.reply_timeout)
    poll(lambda: counters(lead)["slot_drafted"] > 0 or s.done.is_set(), a.kill_wait)
    before = counters(lead)
    out: dict = {"killed_at_event": len(s.events), "killed_at_s": time.monotonic()}
    killed_mid_reply = not s.done.is_set()
    back.kill(signal.SIGKILL)
    second = roles.back()
    procs.append(second)
    wait_until(lambda: attached(second) or s.done.is_set(), a.start_timeout,
               "the second back to attach")
    out["restart_s"] = time.monotonic() - out.pop("killed_at_s")
    out["attached_at_event"] = len(s.events)
    reattached_mid_reply = not s.done.is_set()
    at_attach = counters(lead)
    poll(lambda: counters(lead)["draft_posts_total"] > at_attach["draft_posts_total"]
         or s.done.is_set(), a.reply_timeout)
    reader.join(a.reply_timeout)
    after = counters(lead)
    out |= {"counters_at_kill": before, "counters_at_restart": at_attach, "counters_end": after,
            "reply_tokens": s.usage.get("completion_tokens"), "finish": s.finish,
            "error": s.error, "reply_tok_s": decode_rate(s), "reply_s": s.events[-1]
            if s.events else None, "reply_head": "".join(s.text)[:300]}
    out["checks"] = {
        "the back was killed mid-reply": killed_mid_reply,
        "reply ended at max_tokens": s.finish == "length" and s.error is None
        and s.usage.get("completion_tokens") == a.max_tokens,
        "the second back attached mid-reply": reattached_mid_reply,
        "drafts posted and verified before the kill": before["draft_posts_total"] > 0
        and before["slot_drafted"] > 0,
        "drafts posted after the restart": after["draft_posts_total"]
        > at_attach["draft_posts_total"],
        "draft tokens accepted": after["accepted_tokens_total"] > 0,
        "lead alive": lead.alive(),
        "the second back alive": second.alive(),
    }
    return out


def llama_server_rate(a: argparse.Namespace) -> dict:
    """Plain llama-server on the target: its own decode speed (timings.predicted_per_second)
    over `alone_tokens` tokens, ignoring end tokens."""
    port = free_port()
    ngl = "all" if a.ngl < 0 else str(a.ngl)  # llama-server's -1 is 'auto' (fit to memory)
    args = ["-m", a.target, "--host", "127.0.0.1", "--port", str(port), "-ngl", ngl,
            "-c", str(a.ctx), "-np", "1"]
    pin = a.lead_cpus if a.lead_cpus and shutil.which("taskset") else None
    if a.lead_cpus:
        args = ["-t", str(len(_cpus(a.lead_cpus))), *args]
    p = Proc(args, None, "llama-server", cpus=pin, program=a.llama_server)
    try:
        p.wait_serving("llama-server", port, a.start_timeout)
        body = {"prompt": PROMPT, "n_predict": a.alone_tokens, "temperature": 0,
                "ignore_eos": True, "cache_prompt": False}
        r = httpx.post(f"http://127.0.0.1:{port}/completion", json=body,
                       timeout=a.reply_timeout).json()
        t = r.get("timings", {})
        return {"tok_s": t.get("predicted_per_second"), "tokens": t.get("predicted_n"),
                "prompt_tok_s": t.get("prompt_per_second")}
    finally:
        p.stop()


def _cpus(text: str) -> list[int]:
    from device.measure import parse_cpus

    return sorted(parse_cpus(text))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.serve", description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True, help="the target's GGUF")
    p.add_argument("--back-model", help="the back's GGUF (default: the target's, see above)")
    p.add_argument("--ngl", type=int, default=-1, help="target layers on the GPU")
    p.add_argument("--lead-cpus", default="0-1")
    p.add_argument("--back-cpus", default="2-15")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--verify-cost", default="", help="lead's --verify-cost (skips pricing)")
    p.add_argument("--draft-len", type=int, default=0,
                   help="lead's --draft-len (0: lead chooses what pays)")
    p.add_argument("--alone-tokens", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--kill-wait", type=float, default=30,
                   help="most seconds to wait for lead to verify the first back's drafts")
    p.add_argument("--start-timeout", type=float, default=120)
    p.add_argument("--reply-timeout", type=float, default=120)
    p.add_argument("--llama-server", default="", help="llama-server's binary ('': skip)")
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    a.back_model = a.back_model or a.target
    result = serve(a)
    if a.llama_server:
        try:
            result["llama_server"] = llama_server_rate(a)
        except (AssertionError, httpx.HTTPError, OSError) as exc:
            result["llama_server"] = {"error": str(exc)[:500]}
    Path(a.out).write_text(json.dumps(result, indent=1))
    failed = [k for k, ok in result["checks"].items() if not ok]
    print(f"lead alone {result.get('lead_alone_tok_s', 0):.1f} tok/s; reply "
          f"{result.get('reply_tokens')} tokens at {result.get('reply_tok_s', 0):.1f} tok/s, "
          f"back restarted in {result.get('restart_s', 0):.1f} s; "
          + ("all checks passed" if not failed else f"FAILED: {'; '.join(failed)}"),
          file=sys.stderr)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

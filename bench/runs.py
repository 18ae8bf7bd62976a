"""One measurement per (configuration, prompt), the same way for every configuration.

A Result holds what the report needs: tokens, decode seconds (first token to last),
time to first token, drafted / accepted tokens, verify steps (and those that rejected
a draft token: acceptance per token is accepted / (accepted + rejections)), the text,
and how many steps after a rejection found a draft ready (None: lead does not count it).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import httpx

from bench.procs import Lead, metrics
from shared.wire.httpclient import sse_events


@dataclass
class Result:
    config: str
    prompt: int
    tokens: int
    decode_s: float  # seconds for the tokens after the first
    ttft_s: float
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    text: str = ""
    rejections: int = 0  # verify steps that rejected a draft token
    round: int = 0  # which repetition (--repeat) this reply came from
    token_ids: list[int] = field(default_factory=list)  # the raw loop's reply, for the bound
    after_rejection: int | None = None  # lead's steps that followed a rejecting step
    ready_after_rejection: int | None = None  # of those, steps that found a draft ready
    prompt_tokens: int = 0  # the prompt's, as the server counted them (0: not told)

    @property
    def tok_s(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def row(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s}


def lead_decode_s(sample: dict[str, float]) -> float:
    """Lead's own decode seconds over every reply so far, from its /metrics."""
    rate = sample.get("duo_decode_tokens_per_second", 0.0)
    return sample.get("duo_generated_tokens_total", 0.0) / rate if rate else 0.0


def via_lead(config: str, lead: Lead, index: int, text: str, n: int,
             stream: bool = True) -> Result:
    """One chat reply from a lead process; decode time excludes the prompt. Streamed, as
    users get it, timed by the tokens' arrival here; not streamed, timed by lead's own
    clock, so that no client works while lead decodes (as with the raw loop)."""
    before = metrics(lead)
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n, "stream": stream}
    t0 = time.perf_counter()
    if stream:
        usage, pieces, decode_s, ttft_s = _streamed(lead, body, t0)
    else:
        reply = httpx.post(f"{lead.url}/v1/chat/completions", json=body, timeout=900).json()
        usage, pieces = reply["usage"], [reply["choices"][0]["message"]["content"]]
    after = metrics(lead)
    if not stream:  # lead's clock times n tokens, one step each; the raw loop times n - 1
        lead_s = lead_decode_s(after) - lead_decode_s(before)
        tokens = usage.get("completion_tokens", 0)
        decode_s = lead_s * (tokens - 1) / tokens if tokens else 0.0
        ttft_s = time.perf_counter() - t0 - lead_s
    counted = {name: int(after[name] - before[name])
               for name in ("duo_verify_steps_total", "duo_rejecting_steps_total")}
    return Result(config, index, usage.get("completion_tokens", 0), decode_s, ttft_s,
                  usage.get("drafted_tokens", 0), usage.get("accepted_tokens", 0),
                  counted["duo_verify_steps_total"], "".join(pieces),
                  counted["duo_rejecting_steps_total"],
                  after_rejection=counted_since(before, after, "duo_steps_after_rejection_total"),
                  ready_after_rejection=counted_since(before, after,
                                                      "duo_ready_after_rejection_total"),
                  prompt_tokens=usage.get("prompt_tokens", 0))


def counted_since(before: dict[str, float], after: dict[str, float], name: str) -> int | None:
    """A counter's growth between two samples of lead's /metrics; None where this lead
    does not export it (an older lead)."""
    if name not in after:
        return None
    return int(after[name] - before.get(name, 0.0))


def _streamed(lead: Lead, body: dict, t0: float) -> tuple[dict, list[str], float, float]:
    """(usage, text pieces, seconds from the first token's arrival to the last's, TTFT)."""
    t_first = t_last = None
    pieces: list[str] = []
    usage: dict = {}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body, timeout=900) as r:
        for event in sse_events(r):
            if event["duo"]["tokens"]:
                t_last = time.perf_counter()
                t_first = t_first or t_last
            pieces.append(event["choices"][0]["delta"].get("content") or "")
            usage = event.get("usage") or usage
    first = t_first or time.perf_counter()
    return usage, pieces, (t_last or first) - first, first - t0

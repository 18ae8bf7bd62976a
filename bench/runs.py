"""One measurement per (configuration, prompt), the same way for every configuration.

A Result holds what the report needs: tokens, decode seconds (first token to last),
time to first token, drafted / accepted tokens, verify steps (and those that rejected
a draft token: acceptance per token is accepted / (accepted + rejections)), the text.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import httpx

from bench.procs import Lead, metrics


@dataclass
class Result:
    config: str
    prompt: int
    tokens: int
    decode_s: float
    ttft_s: float
    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    text: str = ""
    rejections: int = 0  # verify steps that rejected a draft token
    round: int = 0  # which repetition (--repeat) this reply came from
    token_ids: list[int] = field(default_factory=list)  # the raw loop's reply, for the bound

    @property
    def tok_s(self) -> float:
        return (self.tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def row(self) -> dict:
        return {**asdict(self), "tok_s": self.tok_s}


def via_lead(config: str, lead: Lead, index: int, text: str, n: int) -> Result:
    """Stream one chat reply from a lead process; decode time excludes the prompt."""
    before = metrics(lead)
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n, "stream": True}
    t0 = time.perf_counter()
    t_first = t_last = None
    pieces: list[str] = []
    usage: dict = {}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["duo"]["tokens"]:
                t_last = time.perf_counter()
                t_first = t_first or t_last
            pieces.append(event["choices"][0]["delta"].get("content", ""))
            usage = event.get("usage") or usage
    first = t_first or time.perf_counter()
    after = metrics(lead)
    counted = {name: int(after[name] - before[name])
               for name in ("duo_verify_steps_total", "duo_rejecting_steps_total")}
    return Result(config, index, usage.get("completion_tokens", 0), (t_last or first) - first,
                  first - t0, usage.get("drafted_tokens", 0), usage.get("accepted_tokens", 0),
                  counted["duo_verify_steps_total"], "".join(pieces),
                  counted["duo_rejecting_steps_total"])

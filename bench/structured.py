"""python -m bench.structured: duo on JSON-schema prompts, the back drafting under the
request's grammar against the back drafting blind, and lead alone as the baseline.

Each prompt asks for a `json_schema` reply (strict), greedy. Three configurations:
lead alone; lead + back under the grammar (the back learns it from lead's state and
drafts only what it allows); lead + back `--blind` (drafts as if unconstrained; lead
still verifies under the grammar, so the grammar rejects what the draft gets wrong).

Why three leads, not one lead with each back attached in turn: these machines drift by
~10 % over minutes (docs/development.md), as much as the difference sought here, so the
configurations are interleaved prompt by prompt (order flipped each prompt), as in
`python -m bench`. That needs every configuration up at once: one lead per
configuration, each with its own back. An idle lead and its back cost no CPU while
another lead decodes (a back drafts only while its lead generates); the price is
memory, three targets and two drafts.

Decode time is client-side: from the first streamed token's arrival to the last's, and
tok/s counts the tokens after each reply's first over it (as `python -m bench` does);
`request s` is the whole request, prompt included. Drafted and accepted tokens come
from each reply's `usage`. Every reply is validated with `jsonschema`; `cut` counts
replies that reached --max-tokens (cut JSON is also invalid). With --repeat > 1 a back
has the previous round's reply in its KV cache, which helps both backs alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import cast

import httpx
import jsonschema

from bench import configs, report
from bench.cpuwatch import LoadWatch, caveat
from bench.procs import ROOT, Back, Lead, metric, wait_until
from bench.runs import Result
from shared.placement import PlacementError, allowed_cpus
from shared.wire.httpclient import sse_events

ALONE, UNDER, BLIND = "lead alone", "duo: back under the grammar", "duo: back blind"


@dataclass(frozen=True)
class Case:
    name: str
    prompt: str
    schema: dict


def _obj(required: list[str] | None = None, **properties: dict) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required}


_STR = {"type": "string", "maxLength": 40}
_INT = {"type": "integer"}
CASES = [
    Case("person", "Extract the person from this text as JSON: 'Maria Lopez, 34, works as "
         "a nurse in Madrid.'", _obj(name=_STR, age=_INT, job=_STR, city=_STR)),
    Case("weather", "What is the weather like in Paris today? Answer in JSON.", _obj(
        city=_STR, temperature={"type": "number"}, sunny={"type": "boolean"},
        sky={"enum": ["clear", "cloudy", "rain", "snow"]})),
    Case("build", "Report the status of the last CI build.", {**_obj(
        status={"enum": ["ok", "error", "pending"]}, code=_INT,
        failed_tests={"type": "array", "items": _STR, "maxItems": 3}),
        "additionalProperties": False}),
    Case("packing", "List a few things to pack for a weekend hiking trip.", _obj(
        items={"type": "array", "items": {"type": "string", "maxLength": 20},
               "minItems": 1, "maxItems": 5})),
    Case("order", "Extract the order: 'Ship 2 USB-C cables (SKU C-100) and 1 charger "
         "(SKU P-20) to Ann Lee, urgently.'", _obj(
             customer=_obj(name=_STR), priority={"enum": ["low", "normal", "urgent"]},
             lines={"type": "array", "maxItems": 4, "items": _obj(
                 sku={"type": "string", "maxLength": 12}, quantity=_INT)})),
    Case("function", "Describe a Python function that adds two integers, as JSON.", _obj(
        name={"type": "string", "pattern": "^[a-z_]{1,24}$"},
        parameters={"type": "array", "maxItems": 4, "items": _obj(
            name={"type": "string", "pattern": "^[a-z_]{1,16}$"},
            type={"enum": ["int", "float", "str", "bool"]})},
        returns={"enum": ["int", "float", "str", "bool", "None"]})),
    Case("review", "Classify this review: 'The battery lasts two days, but the screen "
         "scratches easily.'", _obj(
             sentiment={"enum": ["positive", "negative", "mixed"]},
             aspects={"type": "array", "maxItems": 3, "items": _obj(
                 aspect={"type": "string", "maxLength": 20},
                 polarity={"enum": ["positive", "negative"]})})),
    Case("book", "Give the metadata of a well-known science fiction novel as JSON.", _obj(
        title=_STR, author=_STR, year=_INT, genres={
            "type": "array", "maxItems": 3, "items": {
                "enum": ["science fiction", "dystopia", "adventure", "classic"]}})),
]


@dataclass
class Reply(Result):
    wall_s: float = 0.0  # the whole request, client-side
    valid: bool = True  # parses and validates against the case's schema
    cut: bool = False  # reached max_tokens


def valid(text: str, schema: dict) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def body(case: Case, max_tokens: int) -> dict:
    return {"messages": [{"role": "user", "content": case.prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "response_format": {
                "type": "json_schema",
                "json_schema": {"name": case.name, "schema": case.schema, "strict": True}}}


def ask(config: str, lead: Lead, max_tokens: int, index: int) -> Reply:
    """One streamed reply to CASES[index]; decode timed by the tokens' arrival here."""
    case = CASES[index]
    t0 = time.perf_counter()
    t_first = t_last = None
    pieces: list[str] = []
    usage: dict = {}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body(case, max_tokens),
                      timeout=900) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{case.name}: HTTP {r.status_code}: {r.read().decode()}")
        for event in sse_events(r):
            if event["duo"]["tokens"]:
                t_last = time.perf_counter()
                t_first = t_first or t_last
            pieces.append(event["choices"][0]["delta"].get("content") or "")
            usage = event.get("usage") or usage
    wall_s = time.perf_counter() - t0
    first = t_first or t0 + wall_s
    text, tokens = "".join(pieces), usage.get("completion_tokens", 0)
    return Reply(config, index, tokens, (t_last or first) - first, first - t0,
                 usage.get("drafted_tokens", 0), usage.get("accepted_tokens", 0), text=text,
                 wall_s=wall_s, valid=valid(text, case.schema), cut=tokens >= max_tokens)


# --- the report (pure) ---
def table(results: dict[str, list[Reply]], baseline: str) -> str:
    """One row per configuration: totals over its replies, speed against `baseline`."""
    reference = results[baseline]
    base = report.summarise(baseline, reference, None).tok_s
    lines = ["| config | replies | invalid | cut | tokens | decode s | request s | tok/s "
             "| vs lead alone | drafted | accepted | acceptance | differ from lead alone |",
             "|---|" + "---|" * 12]
    for name, replies in results.items():
        s = report.summarise(name, replies, reference)
        drafted, accepted = sum(r.drafted for r in replies), sum(r.accepted for r in replies)
        acceptance = f"{s.acceptance:.0%}" if s.acceptance is not None else "-"
        ratio = f"{s.tok_s / base:.2f}x" if base else "-"
        differ = "-" if name == baseline else f"{s.differing} of {s.prompts} prompts"
        lines.append(
            f"| {name} | {len(replies)} | {sum(not r.valid for r in replies)} | "
            f"{sum(r.cut for r in replies)} | {sum(r.tokens for r in replies)} | "
            f"{sum(r.decode_s for r in replies):.2f} | {sum(r.wall_s for r in replies):.2f} | "
            f"{s.tok_s:.2f} | {ratio} | {drafted} | {accepted} | {acceptance} | "
            f"{differ} |")
    return "\n".join(lines)


def per_case(results: dict[str, list[Reply]], baseline: str, names: list[str]) -> str:
    """Each case: speed against `baseline` and acceptance (accepted / drafted) per config."""
    base = report.speed_by_prompt(results[baseline])
    lines = ["| case | lead alone tok/s | " + " | ".join(names) + " |",
             "|---|---|" + "---|" * len(names)]
    for index, tps in sorted(base.items()):
        cells = []
        for name in names:
            mine = [r for r in results[name] if r.prompt == index]
            drafted = sum(r.drafted for r in mine)
            share = f"{sum(r.accepted for r in mine) / drafted:.0%} of {drafted}" \
                if drafted else "none drafted"
            speed = report.speed_by_prompt(mine).get(index, 0.0)
            cells.append(f"{speed / tps:.2f}x, {share}" if tps else "-")
        lines.append(f"| {CASES[index].name} | {tps:.2f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# --- the edges: arguments, processes, the machine ---
def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.structured",
                                description="duo on JSON-schema prompts, side by side in "
                                "one run: lead alone, lead + a back drafting under the "
                                "request's grammar, lead + a back drafting blind (--blind)",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b",
                   help="lead's model: preset name or GGUF path")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b",
                   help="the backs' model: preset name or GGUF path")
    p.add_argument("--quick", action="store_true",
                   help="SmolLM2 (smollm2-135m) as target and draft")
    p.add_argument("--placement", choices=("default", "pinned"), default="default",
                   help="default: as users run it, lead and back with their default flags "
                   "(on one machine the back sits out beside a lead on every core); pinned: "
                   "lead on the first CPU with 1 thread, the back on the second with 1 thread")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds over the prompts, configurations interleaved per prompt")
    p.add_argument("--max-tokens", type=int, default=200, help="max_tokens of each request")
    a = p.parse_args(argv)
    if a.quick:
        a.target = a.draft = "smollm2-135m"
    if a.repeat < 1 or a.max_tokens < 2:
        p.error("--repeat must be at least 1, --max-tokens at least 2")
    try:
        _place(a)
    except PlacementError as exc:
        p.error(str(exc))
    return a


def _place(a: argparse.Namespace) -> None:
    """The roles' --cpus/--threads, and what lead and back will choose with them."""
    a.lead_cpus = a.back_cpus = None
    a.lead_threads = a.back_threads = 0  # 0: each role's default
    if a.placement == "pinned":
        cpus = sorted(allowed_cpus())
        if len(cpus) < 2:
            raise PlacementError("--placement pinned needs two CPUs; this process has one")
        a.lead_cpus, a.back_cpus = str(cpus[0]), str(cpus[1])
        a.lead_threads = a.back_threads = 1
    configs.resolve_placement(a)


def _cpus_flag(cpus: str | None) -> list[str]:
    return ["--cpus", cpus] if cpus else []


def start(a: argparse.Namespace, stack: ExitStack, blind: bool | None) -> Lead:
    """A lead (stopped when `stack` closes) and, unless `blind` is None, its back."""
    lead = Lead(a.target, "--threads", str(a.lead_threads), *_cpus_flag(a.lead_cpus))
    stack.callback(lead.stop)
    if blind is None:
        return lead
    back = Back(lead, a.draft, "--threads", str(a.back_threads), *_cpus_flag(a.back_cpus),
                *(["--blind"] if blind else []))
    stack.callback(back.stop)
    back.wait_attached(300)
    if not a.back_sits_out:
        wait_until(lambda: metric(lead, "duo_backs_active") >= 1, 60, "the back to be active")
    return lead


def header(a: argparse.Namespace) -> str:
    model = next((line.split(":", 1)[1].strip() for line in _run(["lscpu"]).splitlines()
                  if line.startswith("Model name:")), "unknown CPU")
    commit = _run(["git", "rev-parse", "--short", "HEAD"]).strip() or "unknown"
    if _run(["git", "status", "--porcelain", "--untracked-files=no"]).strip():
        commit += " with uncommitted changes"
    return (f"machine: {model}, {os.cpu_count()} CPUs ({len(allowed_cpus())} usable); "
            f"commit {commit}\ntarget {a.target}, draft {a.draft}; {len(CASES)} json_schema "
            f"prompts x {a.repeat} rounds, max_tokens {a.max_tokens}, greedy, configurations "
            f"interleaved per prompt\nplacement {a.placement.upper()}: lead {a.lead_where}; "
            f"back {a.back_where}")


def _run(argv: list[str]) -> str:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=10,
                              cwd=ROOT).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    from shared.presets import ModelError, resolve_model

    a = parse(argv)
    try:  # a one-line error, not a lead that exits; presets are fetched once, here
        for model in (a.target, a.draft):
            resolve_model(model)
    except ModelError as exc:
        sys.exit(f"python -m bench.structured: error: {exc}")
    print(header(a), flush=True)
    watch = LoadWatch()
    with ExitStack() as stack:
        progress("starting three leads (alone, back under the grammar, back blind)")
        leads = {name: start(a, stack, blind) for name, blind in
                 ((ALONE, None), (UNDER, False), (BLIND, True))}
        runners = {name: partial(ask, name, lead, a.max_tokens)
                   for name, lead in leads.items()}
        results = configs.interleaved(runners, len(CASES), progress, a.repeat)
    show(a, cast(dict[str, list[Reply]], results), watch.share())


def show(a: argparse.Namespace, results: dict[str, list[Reply]], foreign: float | None
         ) -> None:
    print("\n" + table(results, ALONE))
    print("\nPer case, against lead alone run next to it (speed, acceptance of drafted):\n")
    print(per_case(results, ALONE, [UNDER, BLIND]))
    invalid = sum(not r.valid for replies in results.values() for r in replies)
    print(f"\ninvalid replies: {invalid}" + (" (expected 0)" if invalid else ""))
    if a.back_sits_out:
        print("note: the backs sit out in this placement (lead uses every core), so their "
              "rows measure lead with an idle back; --placement pinned gives each a core")
    print(caveat(foreign) or "quiet: others used <= 5 % of the CPU time during the run")


if __name__ == "__main__":
    main(sys.argv[1:])

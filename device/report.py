"""summary.md: the device check's results as Markdown, from results.json's parts (pure)."""

from __future__ import annotations

from device.prices import markdown as price_table
from device.prices import medians


def _f(x: object, fmt: str = "{:.1f}") -> str:
    return fmt.format(x) if isinstance(x, int | float) else "-"


def steps(data: dict) -> list[str]:
    lines = ["| step | status | seconds | last line |", "|---|---|---|---|"]
    for s in data.get("steps", []):
        lines.append(f"| {s['step']} | {s['status']} | {s['seconds']} | "
                     f"{str(s.get('line', '')).replace('|', '/')[:120]} |")
    return lines


def device(data: dict) -> list[str]:
    d, b = data.get("device", {}), data.get("build", {})
    out = [f"Device: {d.get('gpu', 'no GPU')}; {d.get('cpus', '?')} CPUs "
           f"({d.get('cpu', '?')}); Python {d.get('python', '?')}."]
    if b:
        out.append(f"Build ({b.get('device')}): configure {_f(b.get('configure_s'))} s, "
                   f"compile {_f(b.get('compile_s'))} s on {b.get('jobs')} jobs; "
                   f"cuBLAS {b.get('cublas', '-')}, driver {b.get('driver', '-')}.")
    return out


def serve(data: dict) -> list[str]:
    s = data.get("serve", {})
    if not s:
        return ["Serve: not run."]
    checks = s.get("checks", {})
    end = s.get("counters_end", {})
    lines = [f"Serve: lead started in {_f(s.get('lead_start_s'))} s; lead alone "
             f"{_f(s.get('lead_alone_tok_s'))} tok/s; llama-server "
             f"{_f((s.get('llama_server') or {}).get('tok_s'))} tok/s (same GGUF); reply of "
             f"{s.get('reply_tokens')} tokens at {_f(s.get('reply_tok_s'))} tok/s with the back "
             f"killed at event {s.get('killed_at_event')} and attached again at event "
             f"{s.get('attached_at_event')} ({_f(s.get('restart_s'))} s later); draft posts "
             f"{_f(end.get('draft_posts_total'), '{:.0f}')}, draft tokens verified "
             f"{_f(end.get('drafted_tokens_total'), '{:.0f}')}, accepted "
             f"{_f(end.get('accepted_tokens_total'), '{:.0f}')}.", ""]
    lines += [f"- {'ok' if ok else 'FAILED'}: {name}" for name, ok in checks.items()]
    if s.get("error"):
        lines.append(f"- error: {s['error']}")
    return lines


def diagnosis(data: dict) -> list[str]:
    """Where serve failed: each probe's outcome, and the native trace of the first crash."""
    probes = data.get("diagnose", {}).get("probes", [])
    if not probes:
        return []
    lines = ["## Why lead did not serve: probes", "", "| probe | outcome | seconds |",
             "|---|---|---|"]
    lines += [f"| {p['name']} | {p['status']} | {p['seconds']} |" for p in probes]
    crashed = next((p for p in probes if p["trace"]), None)
    if crashed is not None:
        lines += ["", f"Native trace ({crashed['name']}):", "", "```", *crashed["trace"], "```"]
    gdb = data.get("diagnose", {}).get("gdb", [])
    if gdb:
        lines += ["", "The first crash again under gdb (ASLR on), every thread:", "", "```",
                  *gdb[:80], "```"]
    return [*lines, ""]


def prices(data: dict) -> list[str]:
    runs = data.get("prices", {})
    tables = {label: medians(r["samples"]) for label, r in runs.items() if r.get("rounds")}
    lines = [price_table(tables)] if tables else ["No prices."]
    lines += [f"- {label}: {r['error']}" for label, r in runs.items() if "error" in r]
    lines += [f"- {label}: logits not all finite at b = {r['nonfinite_logits_at']} (random "
              "weights; the timing stands)" for label, r in runs.items()
              if r.get("nonfinite_logits_at")]
    return lines


def predictions(data: dict) -> list[str]:
    p = data.get("predict", {})
    rows, acc, over = p.get("rows", []), p.get("acceptance", {}), p.get("overheads", {})
    if not rows:
        return ["No predictions."]
    lines = [f"Acceptance {_f(acc.get('agreement'), '{:.3f}')}, cover "
             f"{_f(acc.get('cover'), '{:.3f}')} ({acc.get('source', '?')}); overhead per step: "
             f"lead {_f(over.get('lead', 0) * 1e3, '{:.2f}')} ms, llama-server "
             f"{_f(over.get('llama_server', 0) * 1e3, '{:.2f}')} ms (measured: "
             f"{', '.join(over.get('measured', [])) or 'none'}).", "",
             "| placement | target ms | draft ms | llama-server | llama-server -md (k) | "
             "lead alone | duo ideal (K) | duo sim | duo sim / llama-server | "
             "duo sim / -md |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['error']} |||||||||")
            continue
        sim = r.get("sim", {})
        duo = sim.get("duo_tok_s")
        lines.append(
            f"| {r['name']} | {_f(r['target_ms'], '{:.2f}')} | {_f(r['draft_ms'], '{:.2f}')} | "
            f"{_f(r['llama_server'])} | {_f(r['llama_server_draft'])} ({r['sync_k']}) | "
            f"{_f(r['lead_alone'])} | {_f(r['duo_ideal'])} ({r['duo_k']}) | "
            f"{_f(duo) if duo else sim.get('error', '-')} | "
            f"{_f(duo / r['llama_server'], '{:.2f}x') if duo else '-'} | "
            f"{_f(duo / r['llama_server_draft'], '{:.2f}x') if duo else '-'} |")
    return lines


def markdown(data: dict) -> str:
    kind = data.get("device_kind", "?")
    parts = [f"# duo device check ({kind})", "", *device(data), "", "## Steps", "",
             *steps(data), "", "## Serve", "", *serve(data), "", *diagnosis(data),
             "## Prices (seconds per evaluation of b tokens: b=1 in ms, larger b over it)", "",
             *prices(data), "", "## Predicted decode speed, tok/s", "", *predictions(data), ""]
    return "\n".join(parts)

"""The benchmark's prompts, shipped with the package: bench/prompts.json (code, explain,
short edits) and bench/edits.json (whole source files, one change each, the file back)."""

from __future__ import annotations

import json
from importlib import resources

WORKLOADS = {"bench": "prompts.json", "edit": "edits.json"}
# Tokens per reply for the edit workload: the longest file of edits.json is 555 tokens of
# the default target's tokenizer, and the reply echoes all of it with its change.
EDIT_TOKENS = 640


def load(workload: str = "bench") -> list[dict]:
    """Every prompt of a workload, {"kind": ..., "text": ...}, in file order."""
    entries = json.loads(resources.files("bench").joinpath(WORKLOADS[workload])
                         .read_text("utf-8"))
    return [edit_prompt(e) for e in entries] if workload == "edit" else entries


def edit_prompt(entry: dict) -> dict:
    """An edits.json entry as a prompt: its task, then the whole file in a code block."""
    text = (f"{entry['task']} Reply with the whole file, changed, in one code block, and "
            f"nothing else.\n\n```{entry['lang']}\n{entry['code']}```")
    return {**entry, "text": text}


def spread(prompts: list[dict], n: int) -> list[dict]:
    """`n` prompts taken from each kind in turn (code, explain, edit, code, ...), so that a
    small sample still holds every kind."""
    kinds: dict[str, list[dict]] = {}
    for p in prompts:
        kinds.setdefault(p.get("kind", ""), []).append(p)
    rounds = max(map(len, kinds.values()), default=0)
    order = [group[i] for i in range(rounds) for group in kinds.values() if i < len(group)]
    return order[:n]

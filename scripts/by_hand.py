"""Default flags, by hand: lead alone against lead with a back, neither given placement flags.

Two lead processes (`--threads 0`, the default) side by side; one gets a back started with
default flags. Replies alternate prompt by prompt; speed is lead's own log line.
REPO is the checkout whose code runs (an old commit in a worktree, for a before/after):

    python scripts/by_hand.py REPO TARGET DRAFT [ROUNDS]   (DRAFT '-': no back at all)
"""

from __future__ import annotations

import json
import re
import statistics
import sys


def main(repo: str, target: str, draft: str, rounds: int = 1) -> None:
    sys.path.insert(0, repo)
    import httpx

    from bench.procs import ROOT, Back, Lead

    assert str(ROOT) == repo, f"bench.procs came from {ROOT}, not {repo}"
    prompts = json.loads((ROOT / "bench" / "prompts.json").read_text())
    common = ["--threads", "0", "--ctx-size", "4096"]  # Lead() passes --threads 1 first
    alone, duo = Lead(target, *common), Lead(target, *common)
    back = None if draft == "-" else Back(duo, draft, "--threads", "0")
    if back:
        back.wait_attached(300)

    def rate(lead: Lead, text: str) -> float:
        httpx.post(f"{lead.url}/v1/chat/completions", timeout=600, json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 64})
        line = [x for x in lead.log().splitlines() if "tokens decoded" in x][-1]
        return float(re.search(r"\(([\d.]+) tok/s\)", line).group(1))  # type: ignore[union-attr]

    pairs = []
    for turn in range(rounds * len(prompts)):
        text = prompts[turn % len(prompts)]["text"]
        order = [alone, duo] if turn % 2 == 0 else [duo, alone]
        got = {id(lead): rate(lead, text) for lead in order}
        pairs.append((got[id(alone)], got[id(duo)]))
        print(f"prompt {turn}: alone {pairs[-1][0]:.1f}  with back {pairs[-1][1]:.1f}",
              flush=True)
    a, d = statistics.mean(p[0] for p in pairs), statistics.mean(p[1] for p in pairs)
    print(f"MEAN alone {a:.2f} tok/s, with back {d:.2f} tok/s, ratio {d / a:.3f}, "
          f"worst prompt {min(p[1] / p[0] for p in pairs):.3f}")
    for proc in (back, alone, duo):
        if proc:
            proc.stop()


if __name__ == "__main__":
    main(*sys.argv[1:4], *(int(x) for x in sys.argv[4:5]))  # type: ignore[arg-type]

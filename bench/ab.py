"""A/B: the back (or lead and back) of another commit against this one's, interleaved.

    python -m bench.ab --before 748181c --b-flags="--branches 8"
    python -m bench.ab --before 748181c --lead-too
    python -m bench.ab --before 748181c --no-back --workload edit

Two leads serve the target on `--lead-cpus`, each with a back on `--back-cpus`: A runs
the back of `--before` (from a git worktree), and with `--lead-too` its lead as well; B
this tree's, with its flags. Both leads are this tree's unless `--lead-too`; with
`--no-back`, two leads alone, A's of `--before` (lead's own drafts compared). Each
prompt runs on A and on B in turn (the order flips each prompt), so drift cancels; per
prompt it prints B / A. Only one reply is decoded at a time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from bench import configs, prompts, report
from bench.procs import ROOT, Back, Lead

SPLIT = dict(lead_cpus="0", back_cpus="1")


def worktree(rev: str, stack: ExitStack) -> Path:
    """A checkout of `rev` beside this one (removed when `stack` closes)."""
    path = Path(tempfile.mkdtemp(prefix="duo-ab-")) / "tree"
    subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=ROOT,
                   check=True, capture_output=True)
    stack.callback(subprocess.run, ["git", "worktree", "remove", "--force", str(path)],
                   cwd=ROOT, capture_output=True)
    return path


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--before", required=True, help="the commit whose back is A")
    p.add_argument("--b-flags", default="", help="flags for this tree's back (B)")
    p.add_argument("--lead-too", action="store_true", help="A's lead is of --before too")
    p.add_argument("--no-back", action="store_true",
                   help="leads alone, A's of --before: lead's own drafts compared")
    p.add_argument("--workload", choices=sorted(prompts.WORKLOADS), default="bench",
                   help="bench: bench/prompts.json; edit: bench/edits.json, files echoed")
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b")
    p.add_argument("--lead-cpus", default=SPLIT["lead_cpus"])
    p.add_argument("--back-cpus", default=SPLIT["back_cpus"])
    p.add_argument("--tokens", type=int, default=None,
                   help="per reply (default: 128; the edit workload, whole files)")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args(argv)
    a.lead_too = a.lead_too or a.no_back
    a.tokens = a.tokens or (prompts.EDIT_TOKENS if a.workload == "edit" else 128)
    return a


def start(a: argparse.Namespace, stack: ExitStack, tree: Path | None, flags: list[str]
          ) -> Lead:
    lead_tree = tree if tree is not None and a.lead_too else ROOT
    lead = Lead(a.target, "--cpus", a.lead_cpus, cwd=lead_tree)
    stack.callback(lead.stop)
    if a.no_back:
        return lead
    common = ("--cpus", a.back_cpus, *flags)
    back = Back(lead, a.draft, *common, cwd=tree or ROOT)
    stack.callback(back.stop)
    back.wait_attached(300)
    return lead


def main(argv: list[str] | None = None) -> None:
    a = parse(argv)
    chosen = prompts.load(a.workload)[: a.prompts]
    with ExitStack() as stack:
        before = worktree(a.before, stack)
        side = "lead" if a.no_back else "lead and back" if a.lead_too else "back"
        leads = {f"A: {side} of {a.before}": start(a, stack, before, []),
                 f"B: this {side} {a.b_flags}".strip(): start(a, stack, None,
                                                              a.b_flags.split())}
        runners = {name: configs.via(name, lead, chosen, a.tokens) for name, lead in leads.items()}
        results = configs.interleaved(runners, len(chosen), lambda s: print(s, flush=True),
                                      a.repeat)
    (name_a, res_a), (name_b, res_b) = results.items()
    for name, res in results.items():
        s = report.summarise(name, res, None)
        ready = "-" if s.ready_after_rejection is None else f"{s.ready_after_rejection:.0%}"
        print(f"{name}: {s.tok_s:.2f} tok/s, acceptance {s.acceptance}, "
              f"tokens/step {s.tokens_per_step}, ready after rejection {ready}")
    for i in range(len(chosen)):
        ta = report.summarise(name_a, [r for r in res_a if r.prompt == i], None).tok_s
        tb = report.summarise(name_b, [r for r in res_b if r.prompt == i], None).tok_s
        print(f"prompt {i}: A {ta:.2f} tok/s, B {tb:.2f} tok/s, B/A {tb / ta:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""The configurations the benchmark compares, each a runner: prompt index -> Result.

Every process and model stays up for the whole run, so that the configurations can be
interleaved prompt by prompt: this machine drifts by ~10 % over minutes, and running
one configuration after another made differences of that size unreadable.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shlex
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from bench.procs import Back, Lead
from bench.runs import Result, via_lead
from shared.placement import (
    LeadPlace,
    allowed_cpus,
    choose_back,
    choose_lead,
    format_cpus,
    parse_cpus,
)

Runner = Callable[[int], Result]
LEAD_ALONE = "lead alone"
LEAD_ALL = "lead alone, every core"
LEAD_NO_NGRAM = "lead alone, own drafts off (--no-ngram)"  # what lead's n-gram drafts give
LEAD_UNSTREAMED = "lead alone, not streamed"  # the raw loop's like: no client per token
DUO_MODEL = "duo: lead + back (model)"
DUO_NGRAM = "duo: lead + back (n-gram)"
RAW = "raw loop"
PLD = "peer: prompt lookup (llama-cpp-python)"


def variant_name(flags: str) -> str:
    return f"lead alone, {flags}"


def sync_name(k: int) -> str:
    return f"peer: synchronous draft loop (k={k})"


@contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """Run the in-process loops on the lead's CPUs, as lead itself runs."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, parse_cpus(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def resolve_placement(a: argparse.Namespace) -> None:
    """Fill in the CPUs of --placement pinned, and what lead and back will choose (the
    in-process loops run as lead does; the draft is priced as the back runs)."""
    allowed = allowed_cpus()
    if a.placement == "pinned" and not a.lead_cpus:  # as `make run`: the back takes the rest
        cpus = sorted(allowed)
        a.lead_cpus = format_cpus(cpus[:max(1, len(cpus) // 2)])
    lead = choose_lead(a.lead_cpus or "all", a.lead_threads, allowed)
    here = LeadPlace.of(lead, allowed)
    back = choose_back(a.back_cpus or "auto", a.back_threads, allowed, here.host, here)
    a.loop_threads, a.draft_threads, a.back_sits_out = lead.threads, back.threads, back.sit_out
    a.draft_cpus = format_cpus(back.cpus) if back.cpus else None  # for pricing the draft
    a.lead_where, a.back_where = lead.describe(), back.describe()


def _cpus_flag(cpus: str | None) -> list[str]:
    return ["--cpus", cpus] if cpus else []


def start_lead(a: argparse.Namespace, stack: ExitStack, lead_extra: list[str],
               back_model: str | None = None, back_extra: list[str] | None = None,
               all_cores: bool = False) -> Lead:
    """A lead process (and its back, if any), stopped when `stack` closes; `all_cores`:
    lead alone on every CPU, whatever the placement."""
    threads = 0 if all_cores else a.lead_threads
    lead = Lead(a.target, "--threads", str(threads), "--n-gpu-layers", str(a.lead_ngl),
                *([] if all_cores else _cpus_flag(a.lead_cpus)), *lead_extra)
    stack.callback(lead.stop)
    if back_model is not None:
        back = Back(lead, back_model, "--threads", str(a.back_threads), "--n-gpu-layers",
                    str(a.back_ngl), *_cpus_flag(a.back_cpus), *(back_extra or []))
        stack.callback(back.stop)
        back.wait_attached(300)
    return lead


def via(config: str, lead: Lead, prompts: list[dict], tokens: int, stream: bool = True
        ) -> Runner:
    return lambda i: via_lead(config, lead, i, prompts[i]["text"], tokens, stream)


def start_all(a: argparse.Namespace, stack: ExitStack, prompts: list[dict],
              ids: list[list[int]], target_path: Path) -> tuple[dict[str, Runner], Lead]:
    """Every configuration, ready to run any prompt; also the lead of the model back."""
    alone = start_lead(a, stack, [])  # no back attached: lead decodes alone
    # one lead per configuration: a lead remembers replies, and would draft one
    # configuration's from another's
    quiet = start_lead(a, stack, [])
    bare = start_lead(a, stack, ["--no-ngram"])
    duo = start_lead(a, stack, [], a.draft)
    ngram = start_lead(a, stack, [], "unused", ["--drafter", "ngram"])
    runners = {LEAD_ALONE: via("lead", alone, prompts, a.tokens),
               LEAD_NO_NGRAM: via("lead no ngram", bare, prompts, a.tokens),
               LEAD_UNSTREAMED: via("lead not streamed", quiet, prompts, a.tokens, False)}
    runners |= variants(a, stack, prompts)
    if a.lead_cpus:  # the honest rival of a split: lead given the back's cores too
        everything = start_lead(a, stack, [], all_cores=True)
        runners[LEAD_ALL] = via("lead all cores", everything, prompts, a.tokens)
    runners |= {DUO_MODEL: via("duo model", duo, prompts, a.tokens),
                DUO_NGRAM: via("duo ngram", ngram, prompts, a.tokens),
                RAW: _raw_runner(a, stack, ids, target_path)}
    if not a.no_peers:
        runners[sync_name(a.sync_k)] = _sync_runner(a, stack, ids, target_path)
        runners[PLD] = _pld_runner(a, ids, target_path)
    if a.llama_server_bin is not None:
        from bench import llamaserver
        from shared.presets import resolve_model

        runners |= llamaserver.start_all(a, stack, prompts, target_path,
                                         resolve_model(a.draft))
    return runners, duo


def variant_refused(flags: str) -> str | None:
    """Why lead would refuse --lead-variant's flags at start (its own one-line error), or
    None: said before any configuration starts."""
    from lead.server.settings import LeadSettings
    from shared.cli import parse_settings

    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parse_settings(LeadSettings, "lead", "", shlex.split(flags))
    except ValueError as exc:  # (shlex: an unclosed quote)
        return str(exc)
    except SystemExit:
        lines = said.getvalue().strip().splitlines()
        return lines[-1].removeprefix("lead: error: ") if lines else "refused by lead"
    return None


def variants(a: argparse.Namespace, stack: ExitStack, prompts: list[dict]) -> dict[str, Runner]:
    """Lead alone with each --lead-variant's extra flags: a setting tried beside the
    default, interleaved with it."""
    return {variant_name(flags): via(f"lead {flags}", start_lead(a, stack, shlex.split(flags)),
                                     prompts, a.tokens) for flags in a.lead_variant}


def _raw_runner(a: argparse.Namespace, stack: ExitStack, ids: list[list[int]],
                path: Path) -> Runner:
    from bench.raw import RawLoop

    with pinned(a.lead_cpus):
        raw = RawLoop(path, a.loop_threads)
    stack.callback(raw.close)

    def run(i: int) -> Result:
        with pinned(a.lead_cpus):
            return raw.measure(i, ids[i], a.tokens)
    return run


def _sync_runner(a: argparse.Namespace, stack: ExitStack, ids: list[list[int]],
                 path: Path) -> Runner:
    from bench.peers import sync_speculative
    from shared.llama.model import LlamaModel
    from shared.presets import resolve_model

    target = LlamaModel(path, a.loop_threads, a.lead_ngl, 2048)
    draft = LlamaModel(resolve_model(a.draft), a.loop_threads, a.back_ngl, 2048)
    stack.callback(target.close)
    stack.callback(draft.close)

    def run(i: int) -> Result:
        with pinned(a.lead_cpus):
            return sync_speculative("sync", i, target, draft, ids[i], a.tokens, a.sync_k)
    return run


def _pld_runner(a: argparse.Namespace, ids: list[list[int]], path: Path) -> Runner:
    from bench.raw import prompt_lookup

    def run(i: int) -> Result:
        with pinned(a.lead_cpus):
            return Result("pld", i, *prompt_lookup(path, a.loop_threads, ids[i], a.tokens))
    return run


def interleaved(runners: dict[str, Runner], n_prompts: int, progress: Callable[[str], None],
                repeat: int = 1) -> dict[str, list[Result]]:
    """Every configuration on every prompt, `repeat` rounds; the order flips each prompt
    (A B C, C B A), so drift over time cancels, and lead alone always runs next to duo
    with the model. (One reply of 64 tokens varies by ~5 % here: repeating lets a
    per-prompt figure rise above that.)"""
    results: dict[str, list[Result]] = {name: [] for name in runners}
    for turn in range(repeat * n_prompts):
        i, round_ = turn % n_prompts, turn // n_prompts
        order = list(runners) if turn % 2 == 0 else list(reversed(runners))
        for name in order:
            result = runners[name](i)
            result.round = round_
            results[name].append(result)
        progress(f"  round {round_ + 1}/{repeat}, prompt {i + 1}/{n_prompts}: " + ", ".join(
            f"{short(name)} {results[name][-1].tok_s:.1f}" for name in runners) + " tok/s")
    return results


def short(name: str) -> str:
    return name.replace("duo: lead + back ", "duo ").replace("peer: ", "")

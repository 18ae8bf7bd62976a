"""python -m bench: duo against its floor and its peers, side by side in one run.

Configurations, same model, prompts and placement: a raw llama-cpp-python greedy loop;
lead alone, with and without its own n-gram drafts; lead + back (draft model); lead + back
(n-gram); llama-cpp-python's prompt-lookup decoding; a synchronous draft-model loop;
llama.cpp's llama-server plain, with --spec-default and with a draft model (where the
binary is found). `--workload edit` asks for whole source files back, each with one
change, instead of the bench prompts; `--workload prompt` times a recorded agent's long
prompt instead (bench/promptbench.py). Then the analytic bound from
the measured verify costs and acceptance, and a draft-length sweep (PNG + JSON).
`--sim` measures the protocol itself with simulated models of chosen cost instead;
`--advise` answers in a minute or two whether duo would be faster on this machine.
"""

from __future__ import annotations

import argparse
import sys
from contextlib import ExitStack
from pathlib import Path

from back.settings import BackSettings
from bench import configs, llamaserver, promptbench, prompts, report
from bench.advise import ADVISE_PROMPTS
from bench.coverage import MEASURED_COVER
from bench.cpuwatch import LoadWatch, caveat
from bench.preflight import OutError, check_models, writable
from bench.procs import ProcExited, metric
from bench.runs import Result
from shared.hugepages import restart_with_huge_pages
from shared.model import Model
from shared.placement import PlacementError


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _draft_lengths(text: str) -> str:
    """--sweep: comma-separated draft lengths 1..64 (lead's limit), or '' for none."""
    try:
        lengths = [int(k) for k in text.split(",") if k.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if any(not 1 <= k <= 64 for k in lengths):
        raise argparse.ArgumentTypeError(f"draft lengths must be 1..64: {text!r}")
    return ",".join(map(str, lengths))


def _seconds(text: str) -> list[float]:
    """--sim-target/--sim-draft: non-negative seconds, comma-separated."""
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not seconds: {text!r}") from None
    if any(not 0 <= v < 10 for v in values):
        raise argparse.ArgumentTypeError(f"seconds must be in [0, 10): {text!r}")
    return values


def _share(text: str) -> float:
    """--cover: a share in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"a share in [0, 1]: {text!r}")
    return value


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="qwen2.5-coder-1.5b",
                   help="target model: preset name or GGUF path")
    p.add_argument("--draft", default="qwen2.5-coder-0.5b",
                   help="draft model of the back and the synchronous loop")
    p.add_argument("--placement", choices=("default", "pinned"), default="default",
                   help="default: as users run it, lead and back with their default threads "
                   "and CPUs; pinned: lead on the first half of the CPUs (--cpus), the back "
                   "takes the rest by itself, as with `make run`")
    p.add_argument("--lead-threads", type=int, default=0,
                   help="lead's --threads (0: lead's default)")
    p.add_argument("--back-threads", type=int, default=0,
                   help="back's --threads (0: back's default)")
    p.add_argument("--lead-cpus", help="lead's --cpus, also for the in-process loops "
                   "(default: from --placement)")
    p.add_argument("--back-cpus", help="back's --cpus (default: from --placement)")
    p.add_argument("--lead-ngl", type=int, default=0, help="lead's --n-gpu-layers")
    p.add_argument("--back-ngl", type=int, default=0, help="back's --n-gpu-layers")
    p.add_argument("--workload", choices=(*prompts.WORKLOADS, promptbench.WORKLOAD),
                   default="bench", help="bench: bench/prompts.json (code, explanations, "
                   "short edits); edit: bench/edits.json, whole source files in nine "
                   "languages, one change each, the whole file asked back; prompt: time to "
                   "first token of a recorded agent's 7k-token request (bench/agent.json), "
                   "cold, the same again and the next turn, lead with its defaults beside "
                   "llama-server, each started afresh")
    p.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server, run "
                   "plain, --spec-default and with the draft model beside the others "
                   "(default: llama-server on PATH, else skipped; '' to skip)")
    p.add_argument("--tokens", type=int, help="tokens decoded per prompt (default: 64; "
                   f"--quick: 24; --workload edit: {prompts.EDIT_TOKENS}, the longest file; "
                   f"--workload prompt: {promptbench.TOKENS})")
    p.add_argument("--prompts", type=int, help="use N prompts of the workload (default: "
                   "all, in file order; --advise: 4, taken from each kind in turn)")
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds over the prompts; per-prompt figures pool the rounds")
    p.add_argument("--sync-k", type=int, default=3,
                   help="draft length of the synchronous loop (at least 1)")
    p.add_argument("--sweep", type=_draft_lengths,
                   help="fixed draft lengths to sweep ('' for none; default: "
                   "1,2,3,4,6,8,12,16, --quick: 1,4, --workload edit: none); auto is "
                   "always added")
    p.add_argument("--sweep-prompts", type=int,
                   help="the sweep uses the first N prompts (default: 3; --quick: 1)")
    p.add_argument("--no-peers", action="store_true", help="skip the llama-cpp-python peers")
    p.add_argument("--lead-variant", action="append", default=[], metavar="FLAGS",
                   help="also run lead alone with these extra flags, as a configuration of "
                   "its own (repeatable; e.g. --lead-variant='--flash-attn on')")
    p.add_argument("--out", default="bench-results", help="folder for JSON and PNG")
    p.add_argument("--quick", action="store_true",
                   help="SmolLM2 as target and draft, 2 prompts, 24 tokens, a short sweep")
    p.add_argument("--advise", action="store_true", help="will duo be faster here? measures "
                   "the target's verify cost, the draft's cost and agreement in each placement "
                   "(a minute or two), and prints the expected speed of each")
    p.add_argument("--cover", type=_share, default=MEASURED_COVER,
                   help="share of rejections whose correction a branch holds, for the ideal "
                   "with branches (and --sim's simulated draft); the default is the draft's "
                   "2nd choice on the default pair (python -m bench.coverage)")
    p.add_argument("--sim", action="store_true", help="SIMULATION: fake models of chosen cost")
    p.add_argument("--sim-target", default="0.03,0.0005", type=_seconds,
                   help="simulated target: seconds per call, per token (GPU-like: flat)")
    p.add_argument("--sim-draft", default="0.003", type=_seconds,
                   help="simulated draft: seconds per call")
    p.add_argument("--sim-agree", type=float, default=0.8,
                   help="simulated draft agreement")
    p.add_argument("--sim-branches", type=int, default=BackSettings().branches,
                   choices=range(9), metavar="0-8",
                   help="most branches the simulated back grows beside its draft, as "
                   "`python -m back --branches` (0: the chain only)")
    p.add_argument("--sim-tree", help=argparse.SUPPRESS)  # gone: its error below
    a = p.parse_args(argv)
    if a.sim_tree is not None:
        p.error("--sim-tree was removed with lead-side trees: lead verifies chains (a back's "
                "branches are still used, as its next draft after a rejection)")
    _fill_defaults(a)
    if a.repeat < 1 or a.prompts < 1 or a.tokens < 2 or a.sweep_prompts < 1:
        p.error("--repeat, --prompts and --sweep-prompts must be at least 1, --tokens at "
                "least 2")
    if len(a.sim_target) != 2 or len(a.sim_draft) != 1 or not 0 <= a.sim_agree <= 1:
        p.error("--sim-target takes CALL,TOKEN seconds, --sim-draft one figure, "
                "--sim-agree a share in [0, 1]")
    if a.advise and a.sim:
        p.error("--advise measures real models; it does not take --sim")
    if a.workload == promptbench.WORKLOAD and (a.sim or a.advise):
        p.error("--workload prompt measures real servers by itself: not with --sim or --advise")
    if a.sync_k < 1:
        p.error("--sync-k must be at least 1")
    for flags in a.lead_variant:
        if (refused := configs.variant_refused(flags)) is not None:
            p.error(f"--lead-variant={flags}: {refused}")
    try:
        configs.resolve_placement(a)
        a.llama_server_bin = llamaserver.find_binary(a.llama_server)
    except (PlacementError, llamaserver.BinaryError) as exc:
        p.error(str(exc))
    return a


def _fill_defaults(a: argparse.Namespace) -> None:
    """Defaults that depend on the mode; what the user set explicitly stays."""
    if a.quick:
        a.target = a.draft = "smollm2-135m"
    edit, prompt = a.workload == "edit", a.workload == promptbench.WORKLOAD
    if prompt:  # one request, a few tokens of reply; no sweep
        a.prompts, a.tokens = a.prompts or 1, a.tokens or promptbench.TOKENS
        a.sweep = "" if a.sweep is None else a.sweep
    if a.sweep_prompts is None:
        a.sweep_prompts = 1 if a.quick else 3
    if a.prompts is None:
        a.prompts = 2 if a.quick else ADVISE_PROMPTS if a.advise else \
            len(prompts.load(a.workload))
    if a.tokens is None:  # an edit's reply is the whole file: cut short, it measures less
        a.tokens = prompts.EDIT_TOKENS if edit else 24 if a.quick else 64
    if a.sweep is None:
        a.sweep = "" if edit else "1,4" if a.quick else "1,2,3,4,6,8,12,16"


def run_models(a: argparse.Namespace) -> dict:
    from shared.presets import resolve_model

    chosen = prompts.load(a.workload)[: a.prompts]
    target_path = resolve_model(a.target)
    ids = [_chat_ids(target_path, p["text"]) for p in chosen]
    notes = llamaserver.notes(a)
    for note in notes:
        progress(note)
    watch = LoadWatch()
    with ExitStack() as stack:
        progress("starting every configuration: lead processes, backs, in-process loops")
        runners, duo = configs.start_all(a, stack, chosen, ids, target_path)
        progress(f"{len(runners)} configurations x {len(chosen)} prompts x {a.repeat} "
                 "rounds, interleaved")
        results = configs.interleaved(runners, len(chosen), progress, a.repeat)
        gauges = {name: metric(duo, f"duo_{name}") for name in ("draft_len", "alpha")}
        sweep = run_sweep(a, chosen[: a.sweep_prompts])
    progress("verify cost per batch size (lead's placement), draft cost and agreement (back's)")
    replies = {r.prompt: r.token_ids for r in results[configs.RAW] if r.round == 0}
    costs, draft_s, replays = measure_costs(a, ids, target_path, resolve_model(a.draft), replies)
    return {"results": results, "costs": costs, "draft_s": draft_s, "gauges": gauges,
            "sweep": sweep, **replays, "foreign_cpu": watch.share(), "notes": notes}


def measure_costs(a: argparse.Namespace, ids: list[list[int]], target_path: Path,
                  draft_path: Path, replies: dict[int, list[int]]
                  ) -> tuple[dict[int, float], float, dict[str, dict[int, list]]]:
    """Verify cost per batch size, draft seconds per token, and for each prompt whether
    the draft's greedy token and its runner-up are each token of the target's reply."""
    from bench.peers import verify_costs
    from shared.llama.model import LlamaModel

    with configs.pinned(a.lead_cpus):
        target = LlamaModel(target_path, a.loop_threads, a.lead_ngl, 2048)
        costs = verify_costs(target, ids[0], list(range(1, 18)))
        target.close()
    with configs.pinned(a.draft_cpus):
        draft = LlamaModel(draft_path, a.draft_threads, a.back_ngl, 2048)
        draft_s = verify_costs(draft, ids[0], [1], repeats=9)[1]
        replays = replayed(draft, {p: (ids[p], reply) for p, reply in replies.items()})
        draft.close()
    return costs, draft_s, replays


def replayed(draft: Model, replies: dict[int, tuple[list[int], list[int]]]
             ) -> dict[str, dict[int, list]]:
    """Per prompt (its ids, the target's reply): where the draft's greedy token is the
    target's ("agreement"), where its runner-up is ("covers"), and the draft's probability
    of its greedy token ("draft_q")."""
    from bench.peers import replay

    runs = {p: replay(draft, prompt, reply) for p, (prompt, reply) in replies.items()}
    return {"agreement": {p: r.agrees for p, r in runs.items()},
            "covers": {p: r.covers for p, r in runs.items()},
            "draft_q": {p: r.probs for p, r in runs.items()}}


def _chat_ids(path: Path, text: str) -> list[int]:
    from shared.llama.model import LlamaModel

    m = LlamaModel(path, threads=1, n_ctx=512)
    try:
        return m.tokenize(m.format_chat([{"role": "user", "content": text}]), special=True,
                          add_bos=False)
    finally:
        m.close()


def run_sweep(a: argparse.Namespace, chosen: list[dict]) -> dict[str, tuple[float, float]]:
    """k -> (duo tok/s, lead alone tok/s), each prompt run alone and with k side by side,
    each by a lead that has not seen it (a lead remembers replies)."""
    lengths = [k for k in a.sweep.split(",") if k.strip()] + ["auto"]
    sweep: dict[str, tuple[float, float]] = {}
    for k in lengths:
        extra = [] if k == "auto" else ["--draft-len", k, "--max-draft", str(max(8, int(k)))]
        progress(f"sweep: draft length {k}")
        with ExitStack() as stack:
            lead = configs.start_lead(a, stack, extra, a.draft)
            alone = configs.via("alone", configs.start_lead(a, stack, []), chosen, a.tokens)
            pairs = [(configs.via(f"k={k}", lead, chosen, a.tokens)(i), alone(i))
                     for i in range(len(chosen))]
        sweep[k] = (report.summarise(k, [d for d, _ in pairs], None).tok_s,
                    report.summarise("alone", [b for _, b in pairs], None).tok_s)
        progress(f"  k={k}: {sweep[k][0]:.2f} tok/s, lead alone {sweep[k][1]:.2f}")
    return sweep


def sim_flags(a: argparse.Namespace) -> tuple[list[str], list[str]]:
    """bench.sim's flags for the simulated lead and back: the back's draft covers the
    share of rejections that the ideal with branches is priced at."""
    call, per_token = a.sim_target
    return (["--call-s", str(call), "--token-s", str(per_token), "--max-tokens", "4096"],
            ["--call-s", str(a.sim_draft[0]), "--agree", str(a.sim_agree),
             "--cover", str(a.cover), "--branches", str(a.sim_branches)])


PEERS = (llamaserver.PLAIN, llamaserver.SPEC_DEFAULT)  # every configuration set against each


def run_sim(a: argparse.Namespace) -> dict:
    from bench.procs import SimBack, SimLead

    call, per_token = a.sim_target
    target, draft = sim_flags(a)
    chosen = prompts.load(a.workload)[: a.prompts]
    with ExitStack() as stack:
        leads = {"SIM lead alone": SimLead(None, *target), "SIM duo: lead + back": SimLead(
            None, *target)}
        for lead in leads.values():
            stack.callback(lead.stop)
        for name in list(leads)[1:]:
            back = SimBack(leads[name], *draft)
            stack.callback(back.stop)
            back.wait_attached()
        runners = {name: configs.via(name, lead, chosen, a.tokens)  # type: ignore[arg-type]
                   for name, lead in leads.items()}
        results = configs.interleaved(runners, len(chosen), progress, a.repeat)
    costs = {b: call + per_token * b for b in range(1, 18)}
    return {"results": results, "costs": costs, "draft_s": a.sim_draft[0], "gauges": {},
            "sweep": {}, **sim_replays(a, chosen, results["SIM lead alone"])}


def sim_replays(a: argparse.Namespace, chosen: list[dict], alone: list[Result]
                ) -> dict[str, dict[int, list]]:
    """The simulated draft replayed on lead alone's replies (first round): where it agrees,
    and where its runner-up is lead's token (a run's few hundred tokens meet shares near
    --sim-agree and --cover, not at them)."""
    from bench.sim import draft_model

    draft = draft_model(a.sim_agree, a.cover)

    def prompt_ids(i: int) -> list[int]:
        return draft.tokenize(draft.format_chat([{"role": "user", "content": chosen[i]["text"]}]))
    return replayed(draft, {r.prompt: (prompt_ids(r.prompt), draft.tokenize(r.text))
                            for r in alone if r.round == 0})


def main(argv: list[str] | None = None) -> None:
    if argv is None:  # the program itself (not a test calling main): its memory first
        restart_with_huge_pages("bench", sys.argv[1:])
    from bench.advise import AdviseError
    from bench.advise import run as advise
    from shared.presets import ModelError

    a = parse(argv)
    out = Path(a.out)
    try:
        if not a.sim:
            check_models(a.target, a.draft)
        if a.advise:
            advise(a, progress)
            return
        writable(out)  # before the run, not after it
        if a.workload == promptbench.WORKLOAD:
            data = promptbench.run(a, progress)
        else:
            data = run_sim(a) if a.sim else run_models(a)
    except (ModelError, AdviseError, ProcExited, OutError, promptbench.RequestFailed) as exc:
        sys.exit(f"python -m bench: error: {exc}")
    (promptbench.show if a.workload == promptbench.WORKLOAD else show)(a, data, out)


def show(a: argparse.Namespace, data: dict, out: Path) -> None:
    results: dict[str, list[Result]] = data["results"]
    base_name = "SIM lead alone" if a.sim else configs.LEAD_ALONE
    duo_name = "SIM duo: lead + back" if a.sim else configs.DUO_MODEL
    reference = results[base_name]
    summaries = [report.summarise(name, rs, reference) for name, rs in results.items()]
    where = "SIMULATION (fake models, chosen costs)" if a.sim else \
        f"target {a.target}, draft {a.draft}"
    print(f"\n{where}; {a.tokens} tokens x {len(reference) // a.repeat} prompts x {a.repeat} "
          "rounds, configurations interleaved per prompt")
    if not a.sim:
        print(f"placement {a.placement.upper()}: lead {a.lead_where}; back {a.back_where}\n")
    print(report.markdown(summaries, base_name, PEERS))
    limit = report.prefill_line(report.first_round(results)[base_name], summaries)
    if limit:
        print(f"\n{limit}")
    first, first_summaries = results, summaries
    if a.repeat > 1:
        print(f"\nFirst round only ({report.FIRST_ROUND}):\n")
        first = report.first_round(results)
        first_summaries = [report.summarise(n, rs, first[base_name]) for n, rs in first.items()]
        print(report.markdown(first_summaries, base_name, PEERS))
    for note in data.get("notes", []):
        print(note)
    client = report.client_note({s.config: s.tok_s for s in summaries})
    if client:
        print(f"\n{client}")
    print("\nPer prompt, against lead alone run next to it:\n")
    print(report.per_prompt(results, base_name, [n for n in results if n != base_name]))
    if llamaserver.PLAIN in results:
        print(f"\nPer prompt, against {llamaserver.PLAIN} run next to it:\n")
        print(report.per_prompt(results, llamaserver.PLAIN,
                                [n for n in results if n != llamaserver.PLAIN], "llama-server"))
    # The ideals price the back's drafts: from the first round, where a real lead has no
    # earlier reply to copy (the simulated one remembers none: every round counts).
    bounds = report.show_bounds(a, data, results if a.sim else first,
                                summaries if a.sim else first_summaries, base_name, duo_name)
    sweep = data["sweep"]
    if sweep:
        print("\n| draft length | tok/s | lead alone, same prompts, side by side | ratio |\n"
              "|---|---|---|---|")
        for k_name, (tps, alone) in sweep.items():
            print(f"| {k_name} | {tps:.2f} | {alone:.2f} | {tps / alone:.2f}x |")
    written = ["sim.json" if a.sim else "bench.json"]
    if sweep and report.plot_sweep(out / "sweep.png", sweep, f"{a.target} + {a.draft}"):
        written.append("sweep.png")
    elif sweep:
        print("\nno sweep.png: matplotlib is not installed (pip install 'duo[bench]')")
    report.write_json(out / written[0], {
        "args": vars(a), "summaries": summaries, "costs": data["costs"],
        "draft_s": data["draft_s"], **bounds, "agreement": data.get("agreement", {}),
        "covers": data.get("covers", {}), "draft_q": data.get("draft_q", {}),
        "sweep": sweep, "gauges": data["gauges"], "foreign_cpu": data.get("foreign_cpu"),
        "results": {n: [r.row() for r in rs] for n, rs in results.items()}})
    note = caveat(data.get("foreign_cpu"))
    if note:
        print(f"\n{note}")
    print(f"\nwrote {out}/{', '.join(written)}")


if __name__ == "__main__":
    main()

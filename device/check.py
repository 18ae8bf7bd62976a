"""python -m device.check STEP: the steps of scripts/device-check.sh that run in Python.

generate: the plan's GGUFs; serve: python -m device.serve on the plan's placement; diagnose
(where serve failed): python -m device.diagnose; price:
python -m device.measure per price run; predict: device/predict.py and bench --sim per
placement; report: results.json and summary.md. Each step reads what the ones before it left
in WORK/results and stops by --deadline (seconds since the epoch), keeping what it has.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from device.plan import PLANS, Plan

LOAD_MARGIN_S = 45  # a price run's load (a 19 GB file) on top of its own deadline


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def left(a: argparse.Namespace) -> float:
    return a.deadline - time.time()


def model_path(a: argparse.Namespace, shape: str) -> Path:
    return Path(a.work) / "models" / f"{shape}.gguf"


def results(a: argparse.Namespace) -> Path:
    path = Path(a.work) / "results"
    path.mkdir(parents=True, exist_ok=True)
    return path


def read(a: argparse.Namespace, name: str) -> dict:
    path = results(a) / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def write(a: argparse.Namespace, name: str, data: dict) -> None:
    (results(a) / f"{name}.json").write_text(json.dumps(data, indent=1))


def generate(a: argparse.Namespace, plan: Plan) -> int:
    from device.gguf_gen import Vocab, write_model
    from device.shapes import SHAPES

    made: dict[str, dict] = {}
    vocab = None
    for name in plan.shapes:  # the serve check's first: it is needed first
        if left(a) < 5:
            break
        t0 = time.monotonic()
        path, done = model_path(a, name), model_path(a, name).with_suffix(".done")
        if done.exists() and path.exists() and done.read_text() == str(path.stat().st_size):
            made[name] = {"bytes": path.stat().st_size, "seconds": 0.0, "kept": True}
            say(f"{name}: kept from an earlier run")  # a rerun on a warm machine
        else:
            vocab = vocab or Vocab.read(Path(a.pack) / "vocab.gguf")
            size = write_model(SHAPES[name], vocab, path)
            done.write_text(str(size))
            made[name] = {"bytes": size, "seconds": time.monotonic() - t0}
            say(f"{name}: {size / 2**30:.2f} GiB in {made[name]['seconds']:.1f} s")
        write(a, "generate", made)
    return 0 if len(made) == len(plan.shapes) else 1


def serve(a: argparse.Namespace, plan: Plan) -> int:
    out = results(a) / "serve.json"
    budget = left(a)
    cmd = [sys.executable, "-m", "device.serve", "--target", str(model_path(a, plan.serve_shape)),
           "--ngl", str(plan.ngl), "--lead-cpus", plan.lead_cpus, "--back-cpus",
           plan.back_cpus, "--max-tokens", str(plan.max_tokens), "--draft-len",
           str(plan.draft_len), "--start-timeout", str(min(120, budget / 3)),
           "--reply-timeout", str(min(180, budget / 2)),
           "--llama-server", str(Path(a.build or Path(a.work) / "build") / "bin" / "llama-server"),
           "--out", str(out)]
    return subprocess.run(cmd, timeout=max(budget, 1)).returncode


def diagnose(a: argparse.Namespace, plan: Plan) -> int:
    """Run where serve failed: device/diagnose.py's probes on the serve check's target."""
    cmd = [sys.executable, "-m", "device.diagnose", "--model",
           str(model_path(a, plan.serve_shape)), "--ngl", str(plan.ngl), "--work", a.work,
           "--draft", str(model_path(a, plan.shapes[1])),
           "--deadline", str(a.deadline), "--out", str(results(a) / "diagnose.json")]
    return subprocess.run(cmd, timeout=max(left(a), 1)).returncode


def price(a: argparse.Namespace, plan: Plan) -> int:
    runs, failed = {}, 0
    folder = results(a) / "prices"
    folder.mkdir(exist_ok=True)
    for i, r in enumerate(plan.prices):
        budget = left(a) - 5
        if budget < 10:
            say(f"{r.label}: skipped, {left(a):.0f} s left")
            failed += 1
            continue
        out = folder / f"{i}.json"
        cmd = [sys.executable, "-m", "device.measure", "--model", str(model_path(a, r.shape)),
               "--label", r.label, "--ngl", str(r.ngl), "--cpus", r.cpus, "--sizes", r.sizes,
               "--repeats", str(r.repeats), "--deadline-s",
               str(min(r.deadline_s, budget - LOAD_MARGIN_S / 3)), "--out", str(out)]
        try:
            code = subprocess.run(cmd, timeout=min(r.deadline_s + LOAD_MARGIN_S, budget)
                                  ).returncode
        except subprocess.TimeoutExpired:
            code = -1
        if code == 0 and out.exists():
            runs[r.label] = {**json.loads(out.read_text()), "run": asdict(r)}
        else:
            failed += 1
            runs[r.label] = {"error": f"exit {code}", "run": asdict(r)}
        write(a, "prices", runs)
    return 1 if failed else 0


def overheads(serve_result: dict, tables: dict[str, dict[int, float]], plan: Plan) -> dict:
    """What each server's step costs beyond (or short of) the priced evaluation: its measured
    plain decode step less the serve target's one-token price (0 where not measured). It
    may be negative: llama-server's step in C++ costs less than an evaluation priced through
    llama-cpp-python; each server's predicted plain speed is then its measured one."""
    label = next((r.label for r in plan.prices
                  if r.shape == plan.serve_shape and r.ngl == plan.ngl), None)
    one = tables.get(label, {}).get(1) if label else None
    out = {"lead": 0.0, "llama_server": 0.0, "measured": []}
    rates = {"lead": serve_result.get("lead_alone_tok_s"),
             "llama_server": (serve_result.get("llama_server") or {}).get("tok_s")}
    for name, rate in rates.items():
        if rate and one:
            out[name] = 1.0 / rate - one
            out["measured"].append(name)
    return out


def predict(a: argparse.Namespace, plan: Plan) -> int:
    from device.predict import load_tables, run_sims, sim_args, sim_size
    from device.predict import predict as rows_for

    tables = load_tables(read(a, "prices"))
    accept = json.loads((Path(a.pack) / "acceptance.json").read_text())
    over = overheads(read(a, "serve"), tables, plan)
    rows = rows_for(tables, [asdict(p) for p in plan.placements], accept, over)
    write(a, "predict", {"rows": rows, "overheads": over, "acceptance": accept})
    budget = left(a) - 5
    jobs = {}
    for row in rows:
        if "error" not in row and budget > 20:
            table = tables[row["target"]]
            folder = results(a) / "sims" / row["name"].replace(" ", "_").replace("/", "_")
            n = sim_size(table, budget - 5, plan.sim_tokens)
            jobs[row["name"]] = sim_args(table, tables[row["draft"]][1], accept["agreement"],
                                         accept["cover"], n, plan.sim_tokens, folder)
    sims = run_sims(jobs, max(budget, 1)) if jobs else {}
    for row in rows:
        row["sim"] = sims.get(row["name"], {"error": "not run (no prices or no time)"})
        duo = row["sim"].get("duo_tok_s")
        say(f"{row['name']}: " + (row["error"] if "error" in row else
            f"llama-server {row['llama_server']:.1f}, -md {row['llama_server_draft']:.1f}, "
            f"duo ideal {row['duo_ideal']:.1f}, duo sim "
            + (f"{duo:.1f} tok/s" if duo else row["sim"]["error"])))
    write(a, "predict", {"rows": rows, "overheads": over, "acceptance": accept})
    return 0 if sims and all("error" not in s for s in sims.values()) else 1


def report(a: argparse.Namespace, plan: Plan) -> int:
    from device.report import markdown

    data = {name: read(a, name) for name in ("device", "build", "generate", "serve",
                                              "diagnose", "prices", "predict")}
    steps_file = results(a) / "steps.jsonl"
    data["steps"] = [json.loads(line) for line in steps_file.read_text().splitlines()
                     ] if steps_file.exists() else []
    data["device_kind"] = a.device
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1))
    (out / "summary.md").write_text(markdown(data))
    say(f"wrote {out}/results.json, {out}/summary.md")
    return 0


STEPS = {"generate": generate, "serve": serve, "diagnose": diagnose, "price": price,
         "predict": predict, "report": report}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.check", description=__doc__.splitlines()[0])
    p.add_argument("step", choices=sorted(STEPS))
    p.add_argument("--device", choices=sorted(PLANS), default="cuda")
    p.add_argument("--work", required=True)
    p.add_argument("--pack", required=True)
    p.add_argument("--out", default="")
    p.add_argument("--build", default="", help="llama.cpp's build folder (default: WORK/build)")
    p.add_argument("--deadline", type=float, required=True, help="seconds since the epoch")
    a = p.parse_args(argv)
    sys.exit(STEPS[a.step](a, PLANS[a.device]))


if __name__ == "__main__":
    main()

"""SIMULATION: lead and back as real processes over HTTP, with fake models of chosen cost.

    python -m bench.sim lead --port 5555 --call-s 0.02 --token-s 0.001
    python -m bench.sim back --lead 127.0.0.1:5555 --agree 0.8 --call-s 0.002

The fake target's logits are a pure function of the context, so its greedy output is
exactly reproducible: fault tests compare replies with and without backs exactly, and
the protocol's own efficiency can be measured independently of this CPU (e.g. a
GPU-like target whose verify cost is flat in the batch size).
"""

from __future__ import annotations

import argparse
import logging
import sys

from bench.coverage import MEASURED_COVER
from bench.fake import FakeModel
from lead.server.settings import LeadSettings
from shared.cli import setup_logging

# The simulated models' logits follow the whole context, not its last few tokens: every
# prompt ends alike ("assistant: "), and a fake of order 3 gave each the same reply, so
# a run of 8 prompts measured one reply's few rejections 8 times.
CONTEXT = 1 << 20


def target_model(a: argparse.Namespace) -> FakeModel:
    return FakeModel(cost_s=(a.call_s, a.token_s), eos_bias=-100.0, name="sim-target",
                     slots=a.parallel, order=CONTEXT)


def draft_model(agree: float, cover: float, cost_s: tuple[float, float] = (0.0, 0.0),
                slots: int = 1) -> FakeModel:
    """The simulated back's draft (the bench replays it on lead's replies)."""
    return FakeModel(salt="sim-draft", agree=agree, cover=cover, cost_s=cost_s, slots=slots,
                     order=CONTEXT)


def run_lead(a: argparse.Namespace) -> None:
    from lead.server.app import create_app
    from lead.server.serve import serve
    # verify_cost: a simulation's prices are its models' own, never LEAD_VERIFY_COST's
    settings = LeadSettings(host=a.host, port=a.port, max_draft=a.max_draft,
                            draft_len=a.draft_len, max_queue=a.max_queue,
                            max_tokens=a.max_tokens, api_key=a.api_key,
                            verify_cost=None, parallel=a.parallel,
                            ngram_memory=0)  # the bench repeats its prompts: see load.py
    app = create_app(settings, target_model(a))
    logging.getLogger("lead").info("SIMULATED lead (fake target) on %s:%d", a.host, a.port)
    serve(app, a.host, a.port, "warning")


def run_back(a: argparse.Namespace) -> None:
    from back.__main__ import run_worker
    from back.client import LeadClient
    from back.drafter import ModelDrafter
    from back.worker import Worker

    draft = draft_model(a.agree, a.cover, (a.call_s, a.token_s), a.slots)
    client = LeadClient(a.lead, a.api_key)
    drafters = [ModelDrafter(draft.slot(i)) for i in range(a.slots)]
    worker = Worker(client, drafters, draft.fingerprint(), draft.n_vocab,
                    max_ahead=a.max_ahead, model=draft)
    worker.batcher.branches = a.branches
    run_worker(worker)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__.splitlines()[0])
    roles = p.add_subparsers(dest="role", required=True)
    lead = roles.add_parser("lead", help="a lead serving a simulated target")
    lead.add_argument("--host", default="127.0.0.1")
    lead.add_argument("--port", type=int, default=5555)
    lead.add_argument("--max-draft", type=int, default=8)
    lead.add_argument("--draft-len", type=int, default=None)
    lead.add_argument("--max-queue", type=int, default=8)
    lead.add_argument("--max-tokens", type=int, default=256)
    lead.add_argument("--parallel", type=int, default=LeadSettings().parallel,
                      help="generations at once (the simulated target's slots)")
    back = roles.add_parser("back", help="a back drafting with a simulated draft model")
    back.add_argument("--lead", default="127.0.0.1:5555")
    back.add_argument("--agree", type=float, default=0.8,
                      help="share of contexts where the draft's logits equal the target's")
    back.add_argument("--cover", type=float, default=MEASURED_COVER,
                      help="where the draft disagrees, the share of contexts where the "
                      "target's token is its second choice (default: as measured on the "
                      "default pair by python -m bench.coverage)")
    back.add_argument("--branches", type=int, default=0,
                      help="most branches grown beside the draft (0: the main chain only)")
    back.add_argument("--max-ahead", type=int, default=16)
    back.add_argument("--slots", type=int, default=4, help="sessions drafted for at once")
    for role in (lead, back):
        role.add_argument("--call-s", type=float, default=0.0, help="seconds per model call")
        role.add_argument("--token-s", type=float, default=0.0, help="seconds per token")
        role.add_argument("--api-key", default=None)
        role.add_argument("--log-level", default="info", help="debug: every step and post")
    a = p.parse_args(argv)
    setup_logging(a.log_level)
    run_lead(a) if a.role == "lead" else run_back(a)


if __name__ == "__main__":
    main(sys.argv[1:])

"""python -m back --lead HOST:PORT: draft for a lead."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from back.client import LeadClient
from back.drafter import Drafter, ModelDrafter, NgramDrafter
from back.placer import Placer
from back.settings import BackSettings
from back.worker import BackFatal, Worker
from shared import crashtrace
from shared.cli import fail, parse_settings, setup_logging
from shared.hugepages import restart_with_huge_pages
from shared.placement import PlacementError
from shared.presets import ModelError

DESCRIPTION = ("duo back: runs a draft model (or n-gram lookup) next to a lead and posts "
               "speculation candidates; join or leave at any time.")
log = logging.getLogger("back")


def build_worker(settings: BackSettings) -> Worker:
    Placer.check(settings.cpus)  # before the model loads
    client = LeadClient(settings.lead, settings.api_key, kind=settings.drafter)
    drafters: list[Drafter]
    fingerprint = n_vocab = model = None
    if settings.drafter == "ngram":
        drafters = [NgramDrafter() for _ in range(settings.slots)]
    else:
        from shared.llama.model import load_model

        # Its threads are set at the handshake, where the back learns where lead runs.
        model = load_model(settings.model, settings.threads or 1, settings.n_gpu_layers,
                           settings.ctx_size, settings.batch_size, settings.rpc,
                           settings.tensor_split, branches=settings.branches,
                           flash_attn=settings.flash_attn, slots=settings.slots)
        fingerprint, n_vocab = model.fingerprint(), model.n_vocab
        drafters = [ModelDrafter(model.slot(i), settings.batch_size, _progress,
                                 blind=settings.blind) for i in range(settings.slots)]
        log.info("draft model %s loaded (%d tokens vocabulary, %d slots)", model.name,
                 model.n_vocab, settings.slots)
    worker = Worker(client, drafters, fingerprint, n_vocab, settings.max_ahead,
                    settings.back_id, model)
    worker.batcher.send_dists = settings.send_dists
    worker.batcher.branches = settings.branches
    worker.on_attach = Placer(settings.cpus, settings.threads, worker.batcher.model_thread,
                              model.set_threads if model is not None else None)
    return worker


def _progress(done: int, total: int) -> None:
    if total > 512:
        log.info("catching up: %d / %d tokens", done, total)


async def serve(worker: Worker) -> None:
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: (worker.stop(), task and task.cancel()))
    log.info("following lead at %s as %s", worker.client.base_url, worker.back_id)
    try:
        await worker.run()
    finally:
        worker.close()
        await worker.client.close()
        log.info("in all: %s", worker.history.totals.line())


def main(argv: list[str] | None = None) -> None:
    if argv is None:  # the program itself (not a test calling main): its memory first
        restart_with_huge_pages("back", sys.argv[1:])
    settings = parse_settings(BackSettings, "python -m back", DESCRIPTION, argv)
    setup_logging(settings.log_level)
    if argv is None:  # a fatal signal names its frames, during the model load too
        crashtrace.install()
    try:
        worker = build_worker(settings)
    except (ModelError, PlacementError) as exc:
        fail(str(exc))
    run_worker(worker)


SWITCH_S = 0.0005


def run_worker(worker: Worker) -> None:
    """Run until SIGINT/SIGTERM (exit 0) or a fatal problem (one-line error, exit 1)."""
    # The model thread waits for the GIL after every model call; while the event loop
    # posts, that wait lasts up to the switch interval (5 ms by default, a draft token).
    sys.setswitchinterval(SWITCH_S)
    try:
        asyncio.run(serve(worker))
    except BackFatal as exc:
        fail(str(exc))
    except asyncio.CancelledError:
        pass
    log.info("stopped")


if __name__ == "__main__":
    main()

"""python -m lead: serve the target model."""

from __future__ import annotations

import logging
import sys

from lead.server.refused import refused
from lead.server.settings import LeadSettings
from shared import crashtrace
from shared.cli import fail, parse_settings, setup_logging
from shared.hugepages import restart_with_huge_pages
from shared.placement import PlacementError, allowed_cpus, apply
from shared.presets import ModelError

DESCRIPTION = ("duo lead: serves the target model with an OpenAI-compatible API and verifies "
               "draft tokens posted by backs (python -m back --lead HOST:PORT).")


def main(argv: list[str] | None = None) -> None:
    refuse_flags(sys.argv[1:] if argv is None else argv)
    if argv is None:  # the program itself (not a test calling main): its memory first
        restart_with_huge_pages("lead", sys.argv[1:])
    settings = parse_settings(LeadSettings, "python -m lead", DESCRIPTION, argv)
    setup_logging(settings.logging_level(settings.log_level, settings.verbose),
                  settings.log_file)
    if settings.list_devices:  # as llama-server: the list, and exit
        print_devices(settings.rpc)
        return
    if argv is None:  # a fatal signal names its frames, during the model load too
        crashtrace.install()
    from lead.server.app import create_app, lead_placement
    from lead.server.loading import Loading
    from lead.server.serve import bound_sockets, serve

    log = logging.getLogger("lead")
    try:
        sockets = bound_sockets(settings.host, settings.port)
    except OSError as exc:
        fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}")
    try:
        placement = lead_placement(settings)
        apply(placement, allowed_cpus())  # before the model: its threads inherit this
        log.info("placement: %s", placement.describe())
        with Loading(sockets):  # 503 "Loading model" meanwhile, as llama-server answers
            app = create_app(settings)
    except BaseException as exc:
        for sock in sockets:  # (a test calling main leaks no port)
            sock.close()
        if isinstance(exc, (ModelError, PlacementError)):
            fail(str(exc))
        raise
    model = app.state.engine.model
    log.info("model %s: %d tokens vocabulary, context %d; listening on %s://%s:%d",
             model.name, model.n_vocab, model.n_ctx,
             "https" if settings.ssl_cert_file else "http", settings.host, settings.port)
    serve(app, settings.host, settings.port, settings.log_level, sockets=sockets)


def print_devices(rpc: str | None) -> None:
    """--list-devices: the devices --device may name (--rpc's servers' among them)."""
    from shared.llama.load import list_devices  # the llama.cpp edge, only when asked

    try:
        print(list_devices(rpc))
    except ModelError as exc:
        fail(str(exc))


def refuse_flags(argv: list[str]) -> None:
    """A one-line error for a flag lead refuses by name (lead/server/refused.py)."""
    why = refused(argv)
    if why is not None:
        fail(why)


if __name__ == "__main__":
    main()

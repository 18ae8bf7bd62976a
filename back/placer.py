"""Where the back drafts, decided anew at every handshake from what lead says of itself."""

from __future__ import annotations

import logging
from collections.abc import Callable

from shared.modelthread import ModelThread
from shared.placement import LeadPlace, Placement, allowed_cpus, apply, choose_back, host_id
from shared.wire.protocol import Info

log = logging.getLogger("back")


class Placer:
    """Chooses CPUs, threads and priority for this back (`choose_back`) and applies them:
    affinity and policy for every thread, the thread count on the model thread."""

    def __init__(self, flag: str, threads: int, model_thread: ModelThread,
                 set_threads: Callable[[int], None] | None = None) -> None:
        self.flag, self.threads = flag, threads
        self.model_thread, self.set_threads = model_thread, set_threads
        self.allowed, self.host = allowed_cpus(), host_id()
        self.current: Placement | None = None

    @staticmethod
    def check(flag: str) -> None:
        """PlacementError where --cpus names CPUs this process may not use: said at startup,
        as lead says it, not found at every handshake and retried."""
        choose_back(flag, 0, allowed_cpus(), host_id(), None)

    async def __call__(self, info: Info) -> Placement:
        """Place this back for the lead of `info`."""
        lead = LeadPlace(info.host, frozenset(info.cpus), info.threads) if info.host else None
        placement = choose_back(self.flag, self.threads, self.allowed, self.host, lead)
        if placement == self.current:
            return placement
        apply(placement, self.allowed)
        if self.set_threads is not None:
            await self.model_thread.run(self.set_threads, placement.threads)
        self.current = placement
        log.info("placement: %s", placement.describe())
        return placement

"""Verify prices measured before serving: a batch of every size a chain may take, some
sizes past them for trees where a token more is nearly free, and a few long ones for lead's
own drafts (sizes between are interpolated). On the model thread, blocking."""

from __future__ import annotations

import logging
from collections.abc import Callable

from lead.policy.cost import CostModel
from shared.model import Model
from shared.modelthread import ModelThread

log = logging.getLogger("lead")
CALIBRATE_MAX_BATCH = 17  # every size up to this one is priced
LONG_SIZES = (24, 32, 48, 65)  # past it, these (lead's own drafts run up to 64 tokens)
# Trees are priced only where a token more costs under 5 % of a batch: a branch adds at
# most ~(1 - alpha) * cover * 3 tokens, about a tenth of a step's, and costs its tokens
# (a CPU core: 9 %; a GPU-like target: 1-2 %).
TREE_MARGINAL = 0.05


class Calibration:
    def __init__(self, model: Model, cost: CostModel, thread: ModelThread,
                 clock: Callable[[], float], tree_slots: int = 0) -> None:
        self.model, self.cost, self.thread, self.clock = model, cost, thread, clock
        self.tree_slots = tree_slots

    def calibrate(self, max_draft: int, passes: int = 2, longest: int = 0) -> None:
        """Price verify batches of 1..max_draft+1 tokens (the fastest of `passes`) before
        serving, so lead need not explore batch sizes on live replies, and a few sizes up
        to `longest`+1 (lead's own drafts; sizes between are interpolated). Blocking."""
        self.thread.call(self._calibrate, max_draft, passes, longest)

    def _calibrate(self, max_draft: int, passes: int, longest: int) -> None:
        chain, tree = calibrated_sizes(max_draft, bool(self.tree_slots))
        long = [b for b in LONG_SIZES if chain[-1] < b <= min(longest + 1, self.model.n_ctx)]
        log.info("pricing verify batches of 1-%d tokens", (long or chain)[-1])
        self.model.evaluate([0], 1)  # the first evaluation allocates; it is not timed
        best = self._price(chain, passes)
        if tree and _marginal(best) < TREE_MARGINAL:
            log.info("a token more costs %.0f %% of a batch: pricing trees of up to %d tokens",
                     100 * _marginal(best), tree[-1])
            best |= self._price(tree, passes)
        self.cost.calibrate(best | self._price(long, passes))
        log.info("%s", self.cost.describe())

    def _price(self, sizes: list[int], passes: int) -> dict[int, float]:
        """The fastest of `passes` evaluations of each batch size, in seconds."""
        best: dict[int, float] = {}
        for _ in range(passes):
            for b in sizes:
                self.model.truncate(0)
                t0 = self.clock()
                self.model.evaluate([0] * b, b)
                best[b] = min(best.get(b, 1e9), self.clock() - t0)
        self.model.truncate(0)
        return best



def calibrated_sizes(max_draft: int, trees: bool) -> tuple[list[int], list[int]]:
    """Batch sizes to price: every one a chain may take; and, for trees, those past them
    up to a draft's worth more."""
    chain = min(max_draft + 1, CALIBRATE_MAX_BATCH)
    top = min(chain + max_draft, CALIBRATE_MAX_BATCH) if trees else chain
    return list(range(1, chain + 1)), list(range(chain + 1, top + 1))


def _marginal(seconds: dict[int, float]) -> float:
    """What a token more adds to the largest priced batch, over that batch's price, on
    average over the sizes priced (one step is noise: CPU kernels make some sizes cheap)."""
    top = max(seconds)
    if top < 2:
        return 1.0
    return (seconds[top] - seconds[1]) / (top - 1) / seconds[top]

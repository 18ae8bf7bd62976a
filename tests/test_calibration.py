"""Verify prices measured before serving: a busy moment while one token is timed must not
make every batch look cheap (then lead verifies its own low-odds drafts on a new reply,
each a batch that emits one token)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pytest

from bench.fake import FakeModel, VirtualClock
from lead.decode.decoder import Decoder
from lead.policy.cost import CostModel
from lead.policy.prices import Prices
from shared.modelthread import ModelThread

LOW_ODDS = [0.2, 0.2, 0.2]  # lead's own prior for a copy after a 3-token match


class BusyOneToken(FakeModel):
    """A fake whose first `busy` one-token evaluations after the warm-up take a second
    more, as on a machine busy while they were timed."""

    def __init__(self, busy: int, clock: VirtualClock) -> None:
        super().__init__(cost_s=(0.003, 0.0005), clock=clock)
        self.busy, self.n_calls = busy, 0

    def evaluate(self, tokens: Sequence[int], n_logits: int,
                 abort: Callable[[], bool] | None = None) -> np.ndarray:
        self.n_calls += 1
        if len(tokens) == 1 and self.n_calls > 1 and self.busy > 0:
            self.busy -= 1
            assert self.clock is not None
            self.clock.advance(1.0)
        return super().evaluate(tokens, n_logits, abort)


def test_a_batch_is_never_priced_below_one_token() -> None:
    prices = Prices()
    prices.calibrate({1: 1.2, 2: 0.14, 3: 0.2, 4: 0.28})  # one token timed in a busy moment
    assert prices.plain() == pytest.approx(0.14)
    assert prices.shape[1] == 1.0 and min(prices.shape.values()) == pytest.approx(1.0)
    assert prices.shape[3] == pytest.approx(0.2 / 0.14)
    assert prices.batch_for(1) == 1


def test_calibration_prices_one_token_beside_every_size() -> None:
    clock = VirtualClock()
    model = BusyOneToken(busy=2, clock=clock)  # both of one token's timings in a plain pass
    cost = CostModel(max_draft=3)
    decoder = Decoder(model, cost, ModelThread("t"), clock)
    try:
        decoder.calibrate(passes=2, longest=0)
    finally:
        decoder.thread.shutdown()
    assert cost.prices.plain() == pytest.approx(model.cost_of(1))
    for b in (2, 3, 4):
        assert cost.prices.shape[b] == pytest.approx(model.cost_of(b) / model.cost_of(1))
    assert cost.allocate([LOW_ODDS]) == [0]

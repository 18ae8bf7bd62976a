"""A back told to slow down is told for how long: its wait covers one post's refill."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel, VirtualClock
from lead.server.app import create_app
from tests.conftest import make_settings
from tests.test_link import link_post


@pytest.mark.parametrize(("rate", "retry_after"), [(0.25, 4), (0.4, 3), (5.0, 1)])
def test_retry_after_is_the_wait_for_one_post(rate: float, retry_after: int) -> None:
    frozen = VirtualClock()  # every post at the same instant: none refills, however slow
    client = TestClient(create_app(make_settings(max_draft_posts=rate, calibrate=False),
                                   FakeModel(), clock=frozen))
    body = {"session_id": "none", "start": 0, "token_ids": [1], "back_id": "b"}
    with client.websocket_connect("/duo/link") as ws:
        answers = [link_post(ws, body) for _ in range(20)]
    assert answers[0] is None  # a rate below one post a second still admits
    refused = [r for r in answers if r is not None and r["status"] == 429]
    assert len(refused) == 20 - max(1, int(rate))  # a second's worth (at least one) let in
    assert refused[0]["retry_after"] == retry_after

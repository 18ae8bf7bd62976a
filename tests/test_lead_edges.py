"""Lead's small pure pieces at its edges: the draft-post limit, Prometheus text, text cut
inside a character, the watch on a silent client and a streamed reply's sender."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.fake import FakeModel
from lead.apis.streaming import KEEPALIVE, StreamedReply
from lead.backs.limits import BACKS_PER_ADDRESS, PostLimiter
from lead.decode.engine import Engine
from lead.decode.metrics import Metrics
from lead.decode.session import Emission
from lead.decode.textstream import TextStream
from lead.server.prometheus import COUNTERS, GAUGES, SLOT_GAUGES, exposition
from lead.server.sendwatch import StallWatch
from shared.wire.scrape import read_samples
from tests.conftest import async_wait_until


def test_one_address_gets_a_few_backs_worth_of_posts_whatever_ids_it_uses() -> None:
    limiter = PostLimiter(rate=5)
    cycling = [limiter.allow("10.0.0.1", f"b{i}", now=0.0) for i in range(40)]
    assert cycling == [True] * (5 * BACKS_PER_ADDRESS) + [False] * (40 - 5 * BACKS_PER_ADDRESS)
    assert limiter.allow("10.0.0.2", "b0", now=0.0)  # another address: its own allowance
    assert limiter.allow("10.0.0.1", "b0", now=1.0)  # a second refills both


def test_one_back_gets_its_rate_and_no_more() -> None:
    limiter = PostLimiter(rate=5)
    one = [limiter.allow("10.0.0.1", "b", now=0.0) for _ in range(8)]
    assert one == [True] * 5 + [False] * 3
    assert limiter.allow("10.0.0.1", "other", now=0.0)  # a second back on that address


def test_metrics_parse_as_prometheus_text_with_help_and_type_for_every_family() -> None:
    metrics = Metrics(requests=2, drafted=10, accepted=4, link_updates=7)
    slots = [{"slot": 0, "state": "idle"},
             {"slot": 1, "state": "decoding", "prompt_left": 0, "tokens": 5, "drafted": 3,
              "accepted": 2}]
    text = exposition(metrics, {"backs_active": 1}, {1: 0.03, 4: 0.05}, slots)
    families = list(text_string_to_metric_families(text))  # the official parser
    assert all(f.documentation and f.type in ("counter", "gauge") for f in families)
    assert text.count("# HELP ") == text.count("# TYPE ") == len(families) == \
        len(COUNTERS) + 3 + 1 + len(SLOT_GAUGES)  # rate, tok/s, backs; verify cost; slots
    samples = read_samples(text)
    assert samples["duo_requests_total"] == 2 and samples["duo_link_updates_total"] == 7
    assert samples["duo_acceptance_rate"] == 0.4 and samples["duo_backs_active"] == 1
    assert samples['duo_verify_cost_seconds{batch="4"}'] == 0.05
    assert samples['duo_slot_busy{slot="0"}'] == 0 and samples['duo_slot_busy{slot="1"}'] == 1
    assert samples['duo_slot_accepted{slot="1"}'] == 2


def test_every_gauge_lead_exports_has_its_help() -> None:
    engine = Engine(FakeModel(), max_draft=4)
    assert set(engine.gauges()) <= set(GAUGES)
    with pytest.raises(KeyError):
        exposition(Metrics(), {"unexplained": 1.0})


def test_a_reply_cut_inside_a_character_ends_before_it() -> None:
    stream = TextStream()
    assert stream.push(b"caf") + stream.push(b"\xc3") + stream.finish() == "caf"
    held = TextStream(["café"])  # held as a possible stop string, then cut
    assert held.push(b"caf") + held.push(b"\xc3") + held.finish() == "caf"


def test_a_silent_client_is_one_whose_mark_stands_still_for_the_timeout() -> None:
    watch = StallWatch(timeout=1.0)
    watch.start(mark=100, now=0.0)
    assert watch.silent_for(100, 0.9) is None  # not yet
    assert watch.silent_for(140, 0.95) is None  # it took some: the count starts again
    assert watch.silent_for(140, 1.9) is None
    assert watch.silent_for(140, 2.0) == pytest.approx(1.05)
    watch.start(mark=140, now=5.0)  # watched again after a pause: from then on
    assert watch.silent_for(140, 5.5) is None


async def _lines(emissions: AsyncIterator[Emission]) -> AsyncIterator[str]:
    async for e in emissions:
        yield f"{e.text}\n"


async def _served(reply: StreamedReply, sent: list[bytes | None],
                  leaves: asyncio.Event | None = None) -> None:
    """Serve `reply`, each body part it sends into `sent` (None: the response's start), to a
    client that disconnects once `leaves` is set (never, if None)."""
    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body"))

    async def receive() -> dict[str, Any]:
        await (leaves or asyncio.Event()).wait()
        return {"type": "http.disconnect"}
    await reply({"type": "http"}, receive, send)


def test_a_streamed_reply_keeps_alive_until_its_first_emission_then_sends_each_in_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("lead.apis.streaming.KEEPALIVE_S", 0.001)
    sent: list[bytes | None] = []
    closed: list[bool] = []

    async def gen() -> AsyncGenerator[Emission, None]:
        try:  # the prompt is read once two keepalives went out
            await async_wait_until(lambda: sent.count(KEEPALIVE) >= 2, what="keepalives")
            yield Emission("a", 1, 0)
            yield Emission("b", 2, 1)
        finally:
            closed.append(True)
    asyncio.run(_served(StreamedReply(gen(), _lines), sent))
    assert sent[0] is None and sent[-3:] == [b"a\n", b"b\n", b""]
    assert set(sent[1:-3]) == {KEEPALIVE} and len(sent) >= 6 and closed == [True]


def test_a_streamed_reply_ends_its_generation_when_the_client_leaves_and_raises_its_error(
        ) -> None:
    closed: list[bool] = []

    async def gen(fails: bool) -> AsyncGenerator[Emission, None]:
        try:
            yield Emission("a", 1, 0)
            if fails:
                raise ValueError("the model failed")
            await asyncio.Event().wait()  # decoding that would go on
            yield Emission("never", 1, 0)
        finally:
            closed.append(True)

    async def left(sent: list[bytes | None]) -> None:
        leaves = asyncio.Event()
        waiting = asyncio.ensure_future(async_wait_until(lambda: b"a\n" in sent, what="a"))
        waiting.add_done_callback(lambda _: leaves.set())
        await _served(StreamedReply(gen(False), _lines), sent, leaves)
    sent: list[bytes | None] = []
    asyncio.run(left(sent))
    assert sent == [None, b"a\n"] and closed == [True]  # no end: the client is gone
    with pytest.raises(ValueError, match="the model failed"):
        asyncio.run(_served(StreamedReply(gen(True), _lines), []))
    assert closed == [True, True]



"""Lead's small pure pieces at its edges: the draft-post limit, Prometheus text, text cut
inside a character, the watch on a silent client and a reply's outbox."""

from __future__ import annotations

import asyncio

import pytest

from lead.delivery import Outbox, ReplyCut
from lead.drafts import BACKS_PER_ADDRESS, PostLimiter
from lead.metrics import EXPORTED_COUNTERS, Metrics, prometheus_text
from lead.session import Emission
from lead.textstream import TextStream
from lead.wire import StallWatch
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


def test_prometheus_text_types_every_sample() -> None:
    text = prometheus_text({"posts": 3}, {"alpha": 0.25})
    assert text == ("# TYPE duo_posts_total counter\nduo_posts_total 3\n"
                    "# TYPE duo_alpha gauge\nduo_alpha 0.25\n")


def test_lead_metrics_export_each_counter_and_gauge() -> None:
    metrics = Metrics(requests=2, drafted=10, accepted=4, state_polls=7)
    lines = metrics.prometheus({"backs_active": 1}).splitlines()
    samples = dict(line.split() for line in lines if not line.startswith("#"))
    assert samples["duo_requests_total"] == "2" and samples["duo_state_polls_total"] == "7"
    assert samples["duo_acceptance_rate"] == "0.4" and samples["duo_backs_active"] == "1"
    gauges = 3  # acceptance_rate, decode_tokens_per_second and the backs_active given
    assert len([line for line in lines if line.startswith("# TYPE")]) == len(samples) == \
        len(EXPORTED_COUNTERS) + gauges


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


def test_an_outbox_gives_what_was_put_in_order_then_ends_as_decoding_did() -> None:
    async def drained(outbox: Outbox) -> list[str]:
        return [e.text async for e in outbox]

    async def body() -> None:
        outbox = Outbox()
        reading = asyncio.create_task(drained(outbox))
        outbox.put(Emission("a", 1, 0))
        await async_wait_until(lambda: outbox.tokens() == 0, what="the reader to take a")
        outbox.put(Emission("b", 2, 1))
        assert outbox.tokens() == 2
        outbox.close()
        assert await reading == ["a", "b"] and outbox.tokens() == 0
        cut = Outbox()
        cut.put(Emission("c", 1, 0))
        cut.close(ReplyCut())
        with pytest.raises(ReplyCut):  # what was put, then the reason it ended
            await drained(cut)
    asyncio.run(body())

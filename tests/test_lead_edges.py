"""Lead's small pure pieces at its edges: the draft-post limit, Prometheus text, text cut
inside a character, the watch on a silent client and a reply's outbox."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from lead.decode.engine import Engine
from lead.decode.metrics import Metrics
from lead.decode.session import Emission
from lead.decode.textstream import TextStream
from lead.drafts.limits import BACKS_PER_ADDRESS, PostLimiter
from lead.server.delivery import Outbox, ReplyCut
from lead.server.prometheus import COUNTERS, GAUGES, SLOT_GAUGES, exposition
from lead.server.wire import StallWatch
from shared.fake import FakeModel
from shared.scrape import read_samples
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
    metrics = Metrics(requests=2, drafted=10, accepted=4, state_polls=7)
    slots = [{"slot": 0, "state": "idle"},
             {"slot": 1, "state": "decoding", "prompt_left": 0, "tokens": 5, "drafted": 3,
              "accepted": 2}]
    text = exposition(metrics, {"backs_active": 1}, {1: 0.03, 4: 0.05}, slots)
    families = list(text_string_to_metric_families(text))  # the official parser
    assert all(f.documentation and f.type in ("counter", "gauge") for f in families)
    assert text.count("# HELP ") == text.count("# TYPE ") == len(families) == \
        len(COUNTERS) + 3 + 1 + len(SLOT_GAUGES)  # rate, tok/s, backs; verify cost; slots
    samples = read_samples(text)
    assert samples["duo_requests_total"] == 2 and samples["duo_state_polls_total"] == 7
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

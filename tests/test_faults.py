"""Fault tests with real processes, each repeated and counted (simulated models).

Lead and back run as real processes (python -m bench.sim) with fake models whose
greedy output is exactly reproducible, so "the reply equals the no-back reply" is
checked exactly. The figures are printed (pytest -s, or the report in the summary).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import httpx
import pytest

from bench.procs import SIM_DRAFT, SIM_TARGET, SimBack, SimLead, wait_until
from shared.wire.httpclient import sse_events
from shared.wire.scrape import read_samples

pytestmark = pytest.mark.process

REPEATS = 20
TOKENS = 80
STARTED_REPEATS, STARTED_TOKENS = 10, 320


def stream(url: str, prompt: str, on_event=None, tokens: int = TOKENS  # type: ignore[no-untyped-def]
           ) -> tuple[str, int, str | None]:
    """(text, accepted tokens, finish_reason) of one streamed reply."""
    text, accepted, finish = [], 0, None
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": tokens,
            "stream": True}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for event in sse_events(r):
            text.append(event["choices"][0]["delta"].get("content") or "")
            accepted += event["duo"]["accepted"]
            finish = event["choices"][0]["finish_reason"] or finish
            if on_event:
                on_event(accepted, len(text))
    return "".join(text), accepted, finish


@pytest.fixture(scope="module")
def lead() -> Iterator[SimLead]:
    proc = SimLead()
    yield proc
    proc.stop()


def report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n[fault figures] {line}")


def test_back_killed_mid_reply_every_reply_completes_unchanged(
        lead: SimLead, capsys: pytest.CaptureFixture[str]) -> None:
    complete = equal = helped = 0
    prompt = "question number one"
    alone, _, _ = stream(lead.url, prompt)  # the fake is exact: one reference serves all
    for _ in range(REPEATS):
        back = SimBack(lead)
        back.wait_attached()

        def kill_once_helped(accepted: int, _: int, back: SimBack = back) -> None:
            if accepted >= 3 and back.alive():
                back.kill(signal.SIGKILL)

        text, accepted, finish = stream(lead.url, prompt, kill_once_helped)
        helped += accepted >= 3 and not back.alive()
        complete += finish == "length"
        equal += text == alone
        back.stop()
    report(capsys, f"back killed mid-reply: {complete}/{REPEATS} replies complete, "
                   f"{equal}/{REPEATS} equal to the no-back reply ({helped} killed after "
                   "drafts were accepted)")
    assert complete == equal == REPEATS and helped >= REPEATS // 2


def test_back_started_mid_reply_helps_that_reply(lead: SimLead,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # A back's process takes ~1 s to start here, 2 s or more beside busy work: a reply of
    # STARTED_TOKENS (~5 s) is still running when it attaches.
    helped = equal = 0
    prompt = "another question"
    alone, _, _ = stream(lead.url, prompt, tokens=STARTED_TOKENS)
    for _ in range(STARTED_REPEATS):
        started: list[SimBack] = []
        accepted_at_start: list[int] = []

        def start_back(accepted: int, n_events: int, started: list[SimBack] = started,
                       accepted_at_start: list[int] = accepted_at_start) -> None:
            if not started and n_events >= 5:
                started.append(SimBack(lead))
                accepted_at_start.append(accepted)

        text, accepted, _ = stream(lead.url, prompt, start_back, STARTED_TOKENS)
        helped += bool(started) and accepted > accepted_at_start[0]
        equal += text == alone
        for b in started:
            b.stop()  # waits for the process to end
    report(capsys, f"back started mid-reply: {helped}/{STARTED_REPEATS} replies got accepted "
                   f"drafts after it joined, {equal}/{STARTED_REPEATS} equal to the no-back "
                   "reply")
    assert equal == STARTED_REPEATS and helped >= STARTED_REPEATS * 0.9


def test_lead_restart_back_reconnects_and_helps(capsys: pytest.CaptureFixture[str]) -> None:
    first = SimLead()
    back = SimBack(first)
    try:
        back.wait_attached()
        before, _, _ = stream(first.url, "restart me")
        first.kill(signal.SIGKILL)
        wait_until(lambda: "lead unreachable" in back.log(), 15, "back to notice")
        second = SimLead(first.port)
        try:
            back.wait_attached(times=2)
            after, accepted, _ = stream(second.url, "restart me")
            outages_logged = back.log().count("lead unreachable")
        finally:
            second.stop()
    finally:
        back.stop()
        first.stop()
    report(capsys, f"lead restarted: back reconnected, next reply {accepted} tokens from "
                   f"accepted drafts, equal to before: {after == before}")
    assert accepted > 0 and after == before
    assert outages_logged == 1  # one outage, logged once however many retries


def generated_total(url: str) -> int:
    return int(read_samples(httpx.get(f"{url}/metrics").text)["duo_generated_tokens_total"])


def test_client_disconnect_cancels_its_generation(lead: SimLead,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import time

    before = generated_total(lead.url)
    body = {"messages": [{"role": "user", "content": "long"}], "max_tokens": 2000,
            "stream": True}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body, timeout=30) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i > 10:
                break
        t0 = time.monotonic()
    wait_until(lambda: not httpx.get(f"{lead.url}/health").json()["busy"], 5, "lead free")
    freed = time.monotonic() - t0
    generated = generated_total(lead.url) - before
    report(capsys, f"client disconnected mid-stream: lead free after {freed:.2f} s, "
                   f"{generated} of 2000 tokens generated")
    assert generated < 2000  # it stopped early, not at max_tokens
    assert stream(lead.url, "next")[2] == "length"


def test_lead_sigterm_ends_in_flight_reply_and_exits_0() -> None:
    lead = SimLead()
    sent: list[bool] = []

    def terminate_once(_: int, n_events: int) -> None:
        if n_events >= 5 and not sent:
            lead.p.send_signal(signal.SIGTERM)
            sent.append(True)

    try:
        text, _, finish = stream(lead.url, "shutting down", terminate_once)
        assert sent and finish == "length" and text  # the reply in flight got its proper end
        assert lead.p.wait(15) == 0
    finally:
        lead.stop()


def test_back_sigterm_exits_0_and_reports(lead: SimLead) -> None:
    back = SimBack(lead)
    back.wait_attached()
    back.p.send_signal(signal.SIGTERM)
    assert back.p.wait(15) == 0
    assert "stopped" in back.log()
    back.stop()


def test_back_with_wrong_key_stops_with_one_line_error() -> None:
    lead = SimLead(None, *SIM_TARGET, "--api-key", "right")
    try:
        back = SimBack(lead, *SIM_DRAFT, "--api-key", "wrong")
        assert back.p.wait(30) == 1
        assert "refused the API key" in back.log() and "Traceback" not in back.log()
        back.stop()
    finally:
        lead.stop()

"""The back survives whatever lead or its model throws: one log line, backoff, retry.

Lead in process, over HTTP and the link, behind a transport that answers some requests with
faults first (a 200 that is not JSON, an Info that fails validation, a 5xx, a link refused)
and refuses some posts on the link (400s, a 429). A draft model that raises ends that
session's drafting, not the back. Only the truly fatal cases stop it (tests/test_worker.py:
key, not a lead, URL).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import httpx
import pytest

from back.backoff import Backoff
from back.client import BadAnswer, LeadClient, LeadError
from back.drafter import ModelDrafter
from back.failures import fatal, outage
from back.worker import Worker
from bench.fake import FakeModel
from shared.wire.protocol import Posted, Refused
from tests.conftest import InProcessLead, async_wait_until
from tests.test_inprocess import ask, new_lead, reference, text_of

Fault = Callable[[], httpx.Response]


def html() -> httpx.Response:
    return httpx.Response(200, text="<html>a proxy's page</html>")


def status(code: int, retry_after: str | None = None) -> Fault:
    headers = {"Retry-After": retry_after} if retry_after else {}
    return lambda: httpx.Response(code, json={"error": {"message": f"fault {code}"}},
                                  headers=headers)


class Faulty(InProcessLead):
    """Lead in process; `faults` answer requests in their order, each the first request
    to its path after the fault before it was met, and the first draft posts on the link
    are refused with the statuses in `refusals`."""

    def __init__(self, app: object, faults: list[tuple[str, Fault]], refusals: list[int]
                 ) -> None:
        super().__init__(app)
        self.faults, self.refusals = faults, refusals

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.faults and self.faults[0][0] == request.url.path:
            return self.faults.pop(0)[1]()
        return await super().handle_async_request(request)

    async def _serve(self, scope: dict, receive: Callable, send: Callable) -> None:
        async def refusing() -> dict:
            while True:
                message = await receive()
                text = message.get("text") or ""
                if not self.refusals or '"type":"draft"' not in text:
                    return message
                refused = Refused(status=self.refusals.pop(0), message="fault", retry_after=0.01,
                                  session_id=Posted.model_validate_json(text).draft.session_id)
                await send({"type": "websocket.send", "text": refused.model_dump_json()})
        await super()._serve(scope, refusing if scope["type"] == "websocket" else receive, send)


def fast_worker(transport: httpx.AsyncBaseTransport, drafter: ModelDrafter | None = None
                ) -> Worker:
    draft = FakeModel(salt="draft", agree=0.8, cost_s=(0.0005, 0.0))
    worker = Worker(LeadClient("http://lead", transport=transport),
                    drafter or ModelDrafter(draft), draft.fingerprint(), draft.n_vocab,
                    back_id="m")
    worker.backoff = Backoff(first=0.001, most=0.01)
    return worker


async def following(worker: Worker, body: Callable[[asyncio.Task[None]], object]) -> None:
    task = asyncio.create_task(worker.run())
    try:
        await body(task)  # type: ignore[misc]
    finally:
        worker.stop()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_bad_answers_5xx_and_refused_posts_are_survived(
        caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        alone = await reference()
        app, _ = new_lead()
        not_info = lambda: httpx.Response(200, json={"version": "seven"})  # noqa: E731
        faults = [("/duo/link", status(502)), ("/duo/info", html), ("/duo/info", not_info),
                  ("/duo/info", status(503)), ("/duo/link", html)]
        async with Faulty(app, faults, refusals=[400, 400, 429]) as transport:
            worker = fast_worker(transport)

            async def check(task: asyncio.Task[None]) -> None:
                await async_wait_until(lambda: not transport.faults, what="the faults")
                await async_wait_until(lambda: worker.version >= 0, what="news taken")
                reply = await ask(transport)
                assert text_of(reply) == alone
                assert not transport.refusals  # every post refused...
                assert reply["usage"]["accepted_tokens"] > 0  # ...and drafts helped after them
                assert not task.done()

            await following(worker, check)
        # two outages (each link refused; the handshakes failing between them, the first's),
        # each logged in one line
        assert worker.backoff.outages == 2
        unusable = [r for r in caplog.records if "answer is unusable" in r.getMessage()]
        assert len(unusable) == 2 and all(r.exc_info is None for r in unusable)
        refused = [r for r in caplog.records if "refused a draft post" in r.getMessage()]
        assert len(refused) == 1  # both refusals came in one session: one line
    asyncio.run(asyncio.wait_for(body(), 60))


class FailsFirstSession(ModelDrafter):
    """A draft model whose first catch-up raises, as llama.cpp's decode may."""

    def __init__(self, model: FakeModel, error: Exception) -> None:
        super().__init__(model)
        self.error: Exception | None = error

    def catch_up(self, lead_tokens: Sequence[int], defer: bool = False) -> int:
        if self.error is not None:
            error, self.error = self.error, None
            raise error
        return super().catch_up(lead_tokens, defer)


@pytest.mark.parametrize("error", [RuntimeError("llama_decode returned -1"),
                                   ValueError("odd logits")])
def test_a_failing_draft_model_ends_that_sessions_drafting_not_the_back(
        error: Exception, caplog: pytest.LogCaptureFixture) -> None:
    async def body() -> None:
        app, _ = new_lead()
        transport = InProcessLead(app)
        draft = FakeModel(salt="draft", agree=0.8, cost_s=(0.0005, 0.0))
        worker = fast_worker(transport, FailsFirstSession(draft, error))

        async def check(task: asyncio.Task[None]) -> None:
            await async_wait_until(lambda: worker.version >= 0, what="handshake")
            first = await ask(transport, "first")
            assert first["usage"]["drafted_tokens"] == 0  # that session: no drafts
            second = await ask(transport, "second")
            assert second["usage"]["accepted_tokens"] > 0  # the next: drafts again
            assert not task.done()

        async with transport:
            await following(worker, check)
        failed = [r for r in caplog.records if "the draft model failed" in r.getMessage()]
        assert len(failed) == 1 and str(error) in failed[0].getMessage()
        assert worker.backoff.outages == 0  # lead was never at fault
    asyncio.run(asyncio.wait_for(body(), 60))


# --- the pieces ---


@pytest.mark.parametrize(("exc", "attached", "stops"), [
    (LeadError("", 401), True, "API key"),
    (LeadError("lead answered 403: lead has no API key, so ...", 403), False, "no API key"),
    (LeadError("", 404), False, "not a duo lead"),
    (LeadError("", 404), True, None),  # a proxy while lead restarts
    (httpx.UnsupportedProtocol("ftp"), False, "cannot reach"),
    (BadAnswer("not JSON", 200), True, None),
    (BadAnswer("no Info", 200), False, "not a duo lead's answer"),
    (LeadError("", 503), False, None),
    (LeadError("", 400), True, None),
    (httpx.ConnectError("refused"), False, None),
    (RuntimeError("a bug"), True, None),
])
def test_only_the_truly_fatal_stop_the_back(exc: Exception, attached: bool,
                                            stops: str | None) -> None:
    stop = fatal(exc, "http://lead", attached)
    assert (stop is None) if stops is None else (stop is not None and stops in str(stop))


def test_each_failure_is_named_in_its_one_line() -> None:
    assert outage(httpx.ConnectError("refused")) == "lead unreachable"
    assert outage(BadAnswer("x", 200)) == "lead's answer is unusable"
    assert outage(KeyError("x")) == "following lead failed"


def test_handshakes_that_lead_answers_without_a_usable_state_back_off_too() -> None:
    backoff = Backoff()
    waits = []
    for second in range(7):  # each handshake answered (ending the outage), no state taken
        waits.append(backoff.failed(float(second))[1])
        backoff.reached(second + 0.5)
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    backoff.steady = True  # a state was taken: the next failure starts over
    assert backoff.failed(9.0)[1] == 0.25


def test_the_client_turns_any_answer_into_the_model_or_a_lead_error() -> None:
    answers = iter([html(), httpx.Response(200, json={"n_vocab": "many"}),
                    status(503)()])
    transport = httpx.MockTransport(lambda _: next(answers))
    client = LeadClient("http://lead", transport=transport)

    async def body() -> None:
        for kind, words in ((BadAnswer, "no JSON"), (BadAnswer, "no Info"),
                            (LeadError, "503")):
            with pytest.raises(kind, match=words):
                await client.info()
    asyncio.run(body())


@pytest.mark.parametrize(("code", "hint"), [(404, True), (426, True), (503, False)])
def test_a_refused_link_says_when_a_proxy_may_be_why(code: int, hint: bool) -> None:
    # a proxy that does not pass the upgrade on hands the link's route a plain GET
    transport = httpx.MockTransport(lambda _: status(code)())
    client = LeadClient("http://lead", transport=transport)

    async def body() -> None:
        with pytest.raises(LeadError) as refused:
            async with client.link():
                pass
        assert refused.value.status == code
        assert ("may not pass WebSockets" in str(refused.value)) is hint
    asyncio.run(body())

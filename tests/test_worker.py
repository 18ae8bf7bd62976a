"""The back's Worker as a whole, with a scripted lead: how it wires its pieces; lead's app
in-process where what lead makes of the back is the point.

The pieces have their own tests: tests/test_back_mirror.py (lead's state),
test_back_jobs.py (model-thread work), test_back_posts.py, test_back_stats.py and
test_back_backoff.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Callable, Sequence

import httpx
import numpy as np
import pytest

from back.backoff import Backoff
from back.client import LeadClient
from back.drafter import Grown, ModelDrafter, NgramDrafter
from back.mirror import GRAMMARS_KEPT
from back.worker import BackFatal, Worker
from bench.fake import FakeModel
from lead.decode.session import Session
from lead.server.app import create_app
from shared.placement import Placement
from shared.sampling import make_draft_rng
from shared.wire.protocol import (
    DraftPost,
    Grammar,
    Info,
    Posted,
    SamplingParams,
    SessionState,
    Update,
    grammar_id,
)
from tests.conftest import InProcessLead, async_wait_until, make_settings

SEED_A, SEED_B = 11, 22


def info(lead_id: str = "L") -> Info:
    return Info(model="fake", lead_id=lead_id, n_vocab=96, fingerprint="fake-96",
                eos_token_ids=[0], n_ctx=2048, max_draft=8, max_post=8, link=True)


def live(version: int, session: str, tokens: list[int], seed: int | None = None,
         done: bool = False, lead_id: str = "L") -> Update:
    return Update(version=version, lead_id=lead_id, sessions=[SessionState(
        session_id=session, token_ids=tokens, n_tokens=len(tokens), done=done, draft_len=1,
        stop=None, sampling=SamplingParams(temperature=1.0, seed=seed))])


class ScriptedLead:
    """A lead whose link is scripted: `news()` gives each update the back reads (awaited
    as the back asks for the next), `heard(post)` takes each draft it posts."""

    async def info(self) -> Info:
        return info()

    @contextlib.asynccontextmanager
    async def link(self) -> AsyncIterator[ScriptedSocket]:
        yield ScriptedSocket(self)

    async def news(self) -> Update:
        await asyncio.Event().wait()  # no more news, until the worker stops
        raise AssertionError("unreachable")

    async def heard(self, post: DraftPost) -> None:
        pass


class ScriptedSocket:
    """The back's end of a scripted lead's link."""

    def __init__(self, lead: ScriptedLead) -> None:
        self.lead = lead

    async def receive_text(self, timeout: float) -> str:
        return (await self.lead.news()).model_dump_json()

    async def send_text(self, text: str) -> None:
        message = json.loads(text)
        if message["type"] == "draft":
            await self.lead.heard(Posted.model_validate(message).draft)

    async def ping(self) -> asyncio.Event:
        return asyncio.Event()  # never answered: the link is not measured

    async def close(self) -> None:
        pass


class GatedDrafter(NgramDrafter):
    """Holds its first catch-up until the test opens `gate`; records each guess's path
    and the first number it drew from the generator it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.gate = threading.Event(), threading.Event()
        self.draws: list[tuple[tuple[int, ...], int]] = []

    def catch_up(self, lead_tokens: Sequence[int], defer: bool = False) -> int:
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        return super().catch_up(lead_tokens)

    def end_growth(self, rows: dict[int, np.ndarray], params: SamplingParams,
                   rng: np.random.Generator, n_prompt: int = 0, chain: bool = True,
                   width: int = 0) -> Grown:
        self.draws.append((tuple(self.local), int(rng.integers(1 << 30))))
        self.local.append(7)
        return Grown(7, 0)


class SessionSwitchingLead(ScriptedLead):
    """Session A starts; while the back's model thread catches up on it, A ends and B
    starts; only then does the catch-up finish."""

    def __init__(self, drafter: GatedDrafter) -> None:
        self.drafter, self.sent = drafter, 0

    async def news(self) -> Update:
        self.sent += 1
        if self.sent == 1:
            return live(1, "A", [1, 2, 3], SEED_A)
        if self.sent == 2:
            assert await asyncio.to_thread(self.drafter.entered.wait, 10), "no catch-up"
            return live(2, "A", [1, 2, 3], SEED_A, done=True)
        if self.sent == 3:
            return live(3, "B", [4, 5, 6], SEED_B)
        self.drafter.gate.set()
        return await super().news()


def first_draw(seed: int) -> int:
    return int(make_draft_rng(seed).integers(1 << 30))


def test_model_work_for_an_ended_session_stays_out_of_the_next() -> None:
    # The model thread's work for session A finishes after the event loop ended A and
    # started B: A's counts must not land in B, and A's draft uses A's generator.
    drafter = GatedDrafter()
    worker = Worker(SessionSwitchingLead(drafter), drafter, None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: any(path == (4, 5, 6) for path, _ in drafter.draws),
                               what="a draft for session B")
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 20))
    draws = dict(drafter.draws)
    assert draws[(1, 2, 3)] == first_draw(SEED_A)  # (B's generator would draw another)
    assert draws[(4, 5, 6)] == first_draw(SEED_B)
    done = {s.session_id: s for s in worker.history.recent}
    assert done["B"].caught_up == 3  # its own 3 tokens, not also A's
    assert done["A"].caught_up == 0  # A's work came back after A ended: dropped


class StaleThenRestartedLead(ScriptedLead):
    """Lead L sends v3, then a stale v2, then v4; then news from another lead process, M,
    comes (and M answers the handshake). Records, as the back asks for each update, the
    version it holds and the handshakes so far."""

    def __init__(self) -> None:
        self.infos = 0
        self.updates = [Update(version=3, lead_id="L"), Update(version=2, lead_id="L"),
                        Update(version=4, lead_id="L"), Update(version=0, lead_id="M")]
        self.held: list[tuple[int, int]] = []
        self.worker: Worker | None = None

    async def info(self) -> Info:
        self.infos += 1
        return info("L" if self.infos == 1 else "M")

    async def news(self) -> Update:
        assert self.worker is not None
        self.held.append((self.worker.version, self.infos))
        if self.updates:
            return self.updates.pop(0)
        return await super().news()


def test_a_stale_update_is_not_taken_for_a_restart_but_another_lead_is() -> None:
    lead = StaleThenRestartedLead()
    worker = Worker(lead, GatedDrafter(), None, None)  # type: ignore[arg-type]
    lead.worker = worker

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: len(lead.held) == 5, what="five updates asked for")
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 10))
    # v2 was dropped (the back still holds v3) and caused no handshake; M's news did, and
    # the back starts over with M
    assert lead.held == [(-1, 1), (3, 1), (3, 1), (4, 1), (-1, 2)]
    assert worker.lead_id == "M"


PROMPT = [1, 2, 3]


class RepeatedPromptLead(ScriptedLead):
    """Session A samples (temperature 1) after PROMPT: lead rejects the back's first guess
    and takes a correction; at the back's next post A ends and B starts on the same prompt.
    Records every post it receives."""

    def __init__(self) -> None:
        self.posts: list[DraftPost] = []
        self.current = live(1, "A", PROMPT, seed=5)
        self.sent = 0  # the version of the last update sent
        self.correction = -1
        self._news = asyncio.Event()

    async def news(self) -> Update:
        while self.current.version <= self.sent:
            await self._news.wait()
        self.sent = self.current.version
        return self.current

    async def heard(self, post: DraftPost) -> None:
        self.posts.append(post)
        if post.session_id == "A" and post.start == len(PROMPT):
            self.correction = 1 if post.token_ids[0] != 1 else 2
            self._move(live(2, "A", [*PROMPT, self.correction], seed=5))
        elif post.session_id == "A":
            self._move(Update(version=3, ended=["A"], sessions=live(3, "B", PROMPT, seed=6)
                              .sessions, lead_id="L"))

    def _move(self, update: Update) -> None:
        self.current = update
        news, self._news = self._news, asyncio.Event()
        news.set()


def test_a_repeated_prompt_posts_no_distribution_of_the_last_session() -> None:
    # B's prompt is A's: the drafter keeps A's path, where lead's correction now stands in
    # the place of A's rejected guess. B's first post carries that path; a distribution
    # left from A would tell lead the correction was drawn from the rejected guess's q.
    lead = RepeatedPromptLead()
    drafter = ModelDrafter(FakeModel(salt="draft", eos_bias=-100.0))
    worker = Worker(lead, drafter, None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: any(p.session_id == "B" for p in lead.posts),
                               what="a post for session B")
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert lead.posts[0].dists is not None  # A's guesses went with their distributions
    first_b = next(p for p in lead.posts if p.session_id == "B")
    assert first_b.start == len(PROMPT) and first_b.token_ids[0] == lead.correction
    assert first_b.dists is None


class ScriptedHttpLead:
    """Lead's /duo routes answered from a script of responses (or errors), in order; past
    its end, no answer comes (a long-poll with no news) until the worker stops."""

    def __init__(self, *script: httpx.Response | Exception) -> None:
        self.script, self.asked = list(script), 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.asked += 1
        if not self.script:
            await asyncio.Event().wait()
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def info_response() -> httpx.Response:
    return httpx.Response(200, json=info().model_dump())


def http_worker(address: str, lead: ScriptedHttpLead | None = None) -> Worker:
    transport = httpx.MockTransport(lead) if lead is not None else None
    worker = Worker(LeadClient(address, transport=transport), ModelDrafter(
        FakeModel(salt="draft")), None, None)
    worker.backoff = Backoff(first=0.001, most=0.001)
    return worker


def run_until(worker: Worker, done: Callable[[], bool]) -> None:
    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: done() or task.done(), what="the scenario")
        worker.stop()  # (it ends a follow; a handshake or a link left waiting is cancelled)
        if not (await asyncio.wait([task], timeout=5))[0]:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    asyncio.run(asyncio.wait_for(scenario(), 20))


@pytest.mark.parametrize("answer", [
    httpx.Response(404, text="Not Found"),  # not a duo lead
    httpx.Response(401, json={"error": {"message": "invalid API key"}}),
    httpx.Response(200, text="<html>hello</html>"),  # not a duo lead either
])
def test_a_lead_that_is_not_one_or_refuses_the_key_stops_the_back(
        answer: httpx.Response) -> None:
    lead = ScriptedHttpLead(answer, answer)
    with pytest.raises(BackFatal) as fatal:
        run_until(http_worker("http://lead", lead), lambda: lead.asked > 1)  # retried
    assert "\n" not in str(fatal.value)  # the one line the back stops with


def test_a_lead_that_serves_no_link_stops_the_back() -> None:
    lead = ScriptedHttpLead(httpx.Response(200, json=info().model_copy(
        update={"link": False}).model_dump()))
    with pytest.raises(BackFatal, match="serves no link"):
        run_until(http_worker("http://lead", lead), lambda: False)


def test_an_address_no_retry_can_reach_stops_the_back() -> None:
    with pytest.raises(BackFatal, match="ftp://"):
        run_until(http_worker("ftp://lead:5555"), lambda: False)


def test_a_lead_not_up_yet_or_behind_a_restarting_proxy_is_retried() -> None:
    # Connection refused, then a proxy's 404 between lead's restarts (to the link, then to
    # the handshake): only a back that has never reached a lead at this address takes a 404
    # to mean it is pointed elsewhere.
    refused = httpx.ConnectError("connection refused")
    lead = ScriptedHttpLead(refused, refused, info_response(), httpx.Response(404),
                            httpx.Response(404), info_response())
    worker = http_worker("http://lead", lead)
    run_until(worker, lambda: not lead.script)
    assert worker.backoff.outages == 2 and worker.lead_id == "L"


def test_a_back_sitting_out_does_not_count_as_drafting_for_lead() -> None:
    # Lead prices its steps apart while a back drafts; a back that sits out slows nothing.
    app = create_app(make_settings(draft_len=4), FakeModel())
    feed = app.state.feed  # type: ignore[attr-defined]
    session = Session(id="s", tokens=PROMPT, n_prompt=3, params=SamplingParams(),
                      rng=np.random.default_rng(0))

    async def sit_out(_: Info) -> Placement:
        return Placement(None, 1, sit_out=True, reason="lead uses every CPU")

    async def scenario() -> None:
        async with InProcessLead(app) as transport:
            worker = Worker(LeadClient("http://lead", transport=transport),
                            ModelDrafter(FakeModel(salt="draft")), None, None, back_id="sitter")
            worker.on_attach = sit_out
            task = asyncio.create_task(worker.run())
            await async_wait_until(lambda: "sitter" in feed.backs.records, what="the back")
            worker.stop()
            await task
    asyncio.run(asyncio.wait_for(scenario(), 20))
    assert not feed.back_drafting(session)
    feed.back_seen("drafter")  # a back that drafts when asked
    assert feed.back_drafting(session)


class ManyGrammarsLead(ScriptedLead):
    """Sessions one after another, each under a grammar of its own; the next starts once
    the back has fetched the last one's."""

    def __init__(self, sessions: int) -> None:
        self.texts = [f'root ::= "{i}"' for i in range(sessions)]
        self.fetched: list[str] = []
        self.sent = 0
        self._fetched = asyncio.Event()

    async def news(self) -> Update:
        while self.sent > len(self.fetched) or self.sent == len(self.texts):
            await self._fetched.wait()
            self._fetched.clear()
        self.sent += 1
        update = live(self.sent, f"S{self.sent}", [1, 2, 3], seed=1)
        update.sessions[0].grammar_id = grammar_id(self.texts[self.sent - 1])
        update.ended = [f"S{self.sent - 1}"] if self.sent > 1 else []
        return update

    async def grammar(self, session_id: str) -> Grammar:
        text = self.texts[int(session_id[1:]) - 1]
        self.fetched.append(session_id)
        self._fetched.set()
        return Grammar(session_id=session_id, grammar_id=grammar_id(text), grammar=text)


def test_a_long_lived_back_holds_a_bounded_number_of_grammars() -> None:
    lead = ManyGrammarsLead(3 * GRAMMARS_KEPT)
    worker = Worker(lead, NgramDrafter(), None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: len(lead.fetched) == len(lead.texts),
                               what="every session's grammar fetched")
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert lead.fetched == [f"S{i + 1}" for i in range(len(lead.texts))]  # each once
    assert len(worker.grammars) == GRAMMARS_KEPT  # the newest, not every one seen
    assert grammar_id(lead.texts[-1]) in worker.grammars

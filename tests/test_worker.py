"""The back's worker on its own: how it takes lead's states and drafts (no lead app)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.worker import Worker
from shared.fake import FakeModel
from shared.protocol import State


def model_worker(transport: httpx.AsyncBaseTransport, agree: float = 0.8) -> Worker:
    draft = FakeModel(salt="draft", agree=agree, cost_s=(0.0005, 0.0))
    client = LeadClient("http://lead", transport=transport, poll_wait=1.0)
    return Worker(client, ModelDrafter(draft), draft.fingerprint(), draft.n_vocab)


def lead_down() -> httpx.MockTransport:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("lead down", request=request)
    return httpx.MockTransport(refuse)


def test_a_stale_state_from_the_same_lead_is_not_taken_for_a_restart() -> None:
    # A watch reply can be older than a post's reply taken meanwhile: its version is lower.
    class Client:
        infos = 0

        def __init__(self) -> None:
            self.replies = [State(version=2, lead_id="L"), State(version=4, lead_id="L")]

        async def info(self) -> None:
            Client.infos += 1
            raise AssertionError("handshake: taken for a restart")

        async def state(self, since: int, offset: int, **_: object) -> State:
            if len(self.replies) == 1:
                worker.stop()
            return self.replies.pop(0)

    worker = model_worker(lead_down())
    worker.client = Client()  # type: ignore[assignment]
    worker.lead_id, worker.state = "L", State(version=3, lead_id="L")
    asyncio.run(asyncio.wait_for(worker._watch(), 5))
    assert Client.infos == 0 and worker.state.version == 4


def test_a_state_starting_past_the_backs_tokens_is_refetched_not_spliced() -> None:
    # e.g. a post's reply that lands after a reconnect reset the back's copy of lead's tokens
    worker = model_worker(lead_down())

    def live(version: int, offset: int, token_ids: list[int]) -> State:
        return State(version=version, session_id="s", offset=offset, token_ids=token_ids,
                     n_tokens=6 if version > 1 else 3, done=False, draft_len=2)

    worker._absorb(live(1, 0, [1, 2, 3]))
    worker._absorb(live(2, 5, [9]))
    assert worker.lead_tokens == [1, 2, 3]
    assert not worker._should_draft()  # nothing drafted on a garbled copy
    assert worker.state.version == -1  # so the watch asks again, from offset 3
    worker._settle(State(version=1, session_id="older", done=False))  # a late reply meanwhile
    assert worker.state.session_id == "s" and worker.lead_tokens == [1, 2, 3]
    worker._settle(live(2, 3, [4, 5, 6]))
    assert worker.lead_tokens == [1, 2, 3, 4, 5, 6] and worker._should_draft()



def test_a_draft_on_a_path_lead_left_is_not_posted_as_a_fresh_one() -> None:
    # Lead's news can land while the model thread drafts on the old path; the old path's
    # tail, posted at lead's new length, would read as a draft continuing lead's tokens.
    posts: list[dict] = []

    def lead(request: httpx.Request) -> httpx.Response:
        posts.append(json.loads(request.content))
        return httpx.Response(200, json=State(version=0).model_dump())

    worker = model_worker(httpx.MockTransport(lead))
    state = State(version=1, session_id="s", offset=0, token_ids=[1, 2, 3], n_tokens=3,
                  done=False, draft_len=3)
    worker._absorb(state)
    worker.burst = 4
    assert worker._extend(list(worker.lead_tokens), worker.state, worker._news_seen) == 4
    old_path = worker.drafter.local[3:]
    moved = [1, 2, 3, (old_path[0] + 1) % 80, 5]  # lead took another token at position 3
    worker._absorb(state.model_copy(update={"version": 2, "token_ids": moved, "n_tokens": 5}))

    async def post_now() -> None:
        assert worker._launch_post() is None  # drafted past tokens lead did not take
        worker._extend(list(worker.lead_tokens), worker.state, worker._news_seen)  # catches up
        task = worker._launch_post()
        assert task is not None
        await task

    asyncio.run(post_now())
    assert [(p["start"], p["token_ids"][:1]) for p in posts] == \
        [(5, worker.drafter.local[5:6])]


class SignalledDraft(FakeModel):
    """A draft model that signals when an evaluation that may be aborted begins."""

    def __init__(self) -> None:
        super().__init__(salt="draft")
        self.evaluating = threading.Event()
        self.polls = 0  # of the abort check

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None) -> None:
        if abort is None:
            return super()._spend(n_tokens, None)
        self.evaluating.set()

        def counted() -> bool:
            self.polls += 1
            return abort()

        super()._spend(n_tokens, counted)


def test_news_that_parts_from_the_draft_stops_its_evaluation_midway() -> None:
    # Right after a rejection the back must evaluate lead's correction; finishing a guess
    # on the dead path first made the next draft miss lead's next step.
    draft = SignalledDraft()
    client = LeadClient("http://lead", transport=httpx.MockTransport(lambda _: httpx.Response(500)))
    worker = Worker(client, ModelDrafter(draft), draft.fingerprint(), draft.n_vocab)
    state = State(version=1, session_id="s", offset=0, token_ids=[1, 2, 3], n_tokens=3,
                  done=False, draft_len=3)
    worker._absorb(state)
    assert worker._extend([1, 2, 3], worker.state, worker._news_seen) == 1
    guess = worker.drafter.local[3]

    def extend_while_news_comes(news: list[int], cost_s: float) -> tuple[int, int]:
        """(tokens drafted, abort checks after the news) while lead's news comes midway."""
        draft.cost_s, seen = (cost_s, 0.0), worker._news_seen
        draft.evaluating.clear()
        with ThreadPoolExecutor(1) as model_thread:
            grown = model_thread.submit(worker._extend, list(worker.lead_tokens), worker.state,
                                        seen)
            assert draft.evaluating.wait(10), "no draft evaluation began"
            worker._absorb(state.model_copy(update={"token_ids": news, "n_tokens": len(news)}))
            polls_at_news = draft.polls
            return grown.result(timeout=10), draft.polls - polls_at_news

    # Lead took the guess: the draft goes on (its evaluation is needed for the next one).
    grown, checks = extend_while_news_comes([1, 2, 3, guess], cost_s=0.5)
    assert grown == 1 and checks > 0
    second = worker.drafter.local[4]
    # Lead took another token than the second guess: that guess's evaluation is dropped
    # (finished, it would draft a third token).
    parted = [1, 2, 3, guess, (second + 1) % 80]
    assert extend_while_news_comes(parted, cost_s=3.0)[0] == 0
    assert worker.stats is not None and worker.stats.cut_short == 1
    assert draft.cached == [1, 2, 3, guess] and worker.drafter.local[4] == second
    draft.cost_s = (0.0, 0.0)
    assert worker._extend(parted, worker.state, worker._news_seen) == 1
    assert worker.drafter.local[:5] == parted

"""The back's Worker as a whole, with a scripted lead (no lead app): how it wires its pieces.

The pieces have their own tests: tests/test_back_mirror.py (lead's state),
test_back_jobs.py (model-thread work), test_back_posts.py, test_back_sessions.py and
test_back_backoff.py.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import numpy as np

from back.worker import Worker
from shared.model import common_prefix
from shared.protocol import DraftPost, Info, SamplingParams, State
from shared.sampling import make_draft_rng
from tests.conftest import async_wait_until

SEED_A, SEED_B = 11, 22


def info(lead_id: str = "L") -> Info:
    return Info(model="fake", lead_id=lead_id, n_vocab=96, fingerprint="fake-96",
                eos_token_ids=[0], n_ctx=2048, max_draft=8, max_post=8)


def live(version: int, session: str, tokens: list[int], seed: int | None = None,
         done: bool = False, lead_id: str = "L") -> State:
    return State(version=version, lead_id=lead_id, session_id=session, token_ids=tokens,
                 n_tokens=len(tokens), done=done, draft_len=1,
                 sampling=SamplingParams(temperature=1.0, seed=seed))


class GatedDrafter:
    """Holds its first catch-up until the test opens `gate`; records each guess's path
    and the first number it drew from the generator it was given."""

    def __init__(self) -> None:
        self.local: list[int] = []
        self.entered, self.gate = threading.Event(), threading.Event()
        self.draws: list[tuple[tuple[int, ...], int]] = []

    def fits(self, n_tokens: int) -> bool:
        return True

    def catch_up(self, lead_tokens: Sequence[int]) -> int:
        if not self.entered.is_set():
            self.entered.set()
            assert self.gate.wait(10), "the test never opened the gate"
        keep = common_prefix(self.local, lead_tokens)
        if keep < len(lead_tokens):
            self.local = list(lead_tokens)
        return len(lead_tokens) - keep

    def next_token(self, params: SamplingParams, rng: np.random.Generator,
                   abort: Callable[[], bool] | None = None) -> tuple[int, None]:
        self.draws.append((tuple(self.local), int(rng.integers(1 << 30))))
        self.local.append(7)
        return 7, None


class SessionSwitchingLead:
    """Session A starts; while the back's model thread catches up on it, A ends and B
    starts; only then does the catch-up finish."""

    def __init__(self, drafter: GatedDrafter) -> None:
        self.drafter, self.polls = drafter, 0
        self.b = live(3, "B", [4, 5, 6], SEED_B)

    async def info(self) -> Info:
        return info()

    async def state(self, since: int, offset: int, **_: object) -> State:
        self.polls += 1
        if self.polls == 1:
            return live(1, "A", [1, 2, 3], SEED_A)
        if self.polls == 2:
            assert await asyncio.to_thread(self.drafter.entered.wait, 10), "no catch-up"
            return live(2, "A", [1, 2, 3], SEED_A, done=True)
        if self.polls == 3:
            return self.b
        self.drafter.gate.set()
        await asyncio.Event().wait()  # no more news, until the worker stops
        raise AssertionError("unreachable")

    async def post_draft(self, post: DraftPost) -> State:
        return self.b


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
    done = {s.session_id: s for s in worker.sessions_done}
    assert done["B"].caught_up == 3  # its own 3 tokens, not also A's
    assert done["A"].caught_up == 0  # A's work came back after A ended: dropped


class StaleThenRestartedLead:
    """Lead L sends v3, then a stale v2 (a watch reply older than a post's reply taken
    meanwhile), then v4; then another lead process, M, answers."""

    def __init__(self) -> None:
        self.infos = 0
        self.replies = [State(version=3, lead_id="L"), State(version=2, lead_id="L"),
                        State(version=4, lead_id="L"), State(version=0, lead_id="M")]
        self.asked: list[tuple[int, int]] = []  # (since, handshakes so far) of each poll

    async def info(self) -> Info:
        self.infos += 1
        return info("L" if self.infos == 1 else "M")

    async def state(self, since: int, offset: int, **_: object) -> State:
        self.asked.append((since, self.infos))
        if self.replies:
            return self.replies.pop(0)
        await asyncio.Event().wait()  # no more news, until the worker stops
        raise AssertionError("unreachable")

    async def post_draft(self, post: DraftPost) -> State:
        raise AssertionError("no session: nothing to post")


def test_a_stale_state_is_not_taken_for_a_restart_but_another_lead_is() -> None:
    lead = StaleThenRestartedLead()
    worker = Worker(lead, GatedDrafter(), None, None)  # type: ignore[arg-type]

    async def scenario() -> None:
        task = asyncio.create_task(worker.run())
        await async_wait_until(lambda: len(lead.asked) == 5, what="five polls")
        worker.stop()
        await task

    asyncio.run(asyncio.wait_for(scenario(), 10))
    # v2 was dropped (the next poll still asks since v3) and caused no handshake; M's
    # state did, and the poll after it asks from scratch.
    assert lead.asked == [(-1, 1), (3, 1), (3, 1), (4, 1), (-1, 2)]
    assert worker.mirror.lead_id == "M"

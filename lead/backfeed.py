"""The back feed: what backs see of the session, when their long-polls wake, and where
their drafts go. Lives on the event loop.

A session's grammar goes to a back once (`grammar_of`, GET /duo/grammar), not in every
state: a state names it by `grammar_id`. Only a trusted back's draft probabilities count.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace

from lead.cost import CostModel
from lead.drafts import BackRegistry, Branch, DraftBoard, RateLimiter, post_candidates
from lead.metrics import Metrics
from lead.session import Session
from shared.protocol import SamplingParams, State, grammar_id
from shared.sampling import Dist

log = logging.getLogger("lead")
POLLS_PER_ADDRESS = 8  # long-polls open at once from one address: a few backs' worth
ARRIVALS_PER_S = 1.0  # how often backs arriving may wake the live panel's streams


def wakes(session: Session | None, quiet_session: str | None, idle: bool,
          wanted: Callable[[], int]) -> bool:
    """Whether a change of state wakes a long-poll. A back that may not draft passes its
    session as `quiet_session`: it wakes only when drafts are wanted (never, if `idle`: a
    back sitting out) or that session changes or ends, so it costs lead no request per
    token. `wanted`: the draft length asked for (asked only when it matters)."""
    if quiet_session is None or session is None or session.id != quiet_session or session.done:
        return True
    return not idle and wanted() > 0


class PollSlots:
    """Long-polls open per client address, at most `most` at once: a back keeps one open,
    and an address opening many would hold as many of lead's waiters."""

    def __init__(self, most: int = POLLS_PER_ADDRESS) -> None:
        self.most = most
        self.open: dict[str, int] = {}

    def take(self, address: str) -> bool:
        n = self.open.get(address, 0)
        if n >= self.most:
            return False
        self.open[address] = n + 1
        return True

    def give(self, address: str) -> None:
        n = self.open.pop(address, 0) - 1
        if n > 0:
            self.open[address] = n


class BackFeed:
    def __init__(self, cost: CostModel, metrics: Metrics,
                 on_arrival: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`on_arrival`: called when a back not heard from recently speaks, at most
        ARRIVALS_PER_S times a second (a back the panel misses shows at its next
        heartbeat); `clock`: when backs are seen (tests give a fake one)."""
        self.cost, self.metrics, self.on_arrival, self.clock = cost, metrics, on_arrival, clock
        self.board = DraftBoard()
        self.backs = BackRegistry()
        self.polls = PollSlots()
        self._arrivals = RateLimiter(ARRIVALS_PER_S)
        self.session: Session | None = None
        self._sampling = SamplingParams()  # the session's, without its grammar's text
        self._grammar_id: str | None = None
        self.version = 0
        self.lead_id = uuid.uuid4().hex[:12]  # versions restart with the process; this does not
        # Replaced on every change: waiters hold no lock a cancellation could leave held.
        self._news = asyncio.Event()
        self._hushed = False  # as last logged

    def wanted(self, session: Session) -> int:
        """The draft length backs are asked for now."""
        return self.cost.wanted(first=session.n_generated == 0)

    def back_drafting(self, session: Session) -> bool:
        """Whether a back drafts during this step, so that its price counts as busy (a back
        sitting out slows nothing: its steps are quiet ones)."""
        return self.backs.drafting(now=self.clock()) > 0 and self.wanted(session) > 0

    def start(self, session: Session) -> None:
        self.board.clear()
        self.session = session
        grammar = session.params.grammar
        self._grammar_id = grammar_id(grammar) if grammar else None
        self._sampling = session.params.model_copy(update={"grammar": None}) if grammar \
            else session.params
        self.notify()

    def end(self) -> None:
        self.board.clear()
        self.notify()

    def notify(self) -> None:
        self.version += 1
        news, self._news = self._news, asyncio.Event()
        news.set()

    def state(self, offset: int = 0, back_id: str = "") -> State:
        s = self.session
        if s is None:
            return State(version=self.version, lead_id=self.lead_id)
        offset = min(max(offset, 0), len(s.tokens))
        return State(version=self.version, lead_id=self.lead_id, session_id=s.id, offset=offset,
                     token_ids=s.tokens[offset:], n_tokens=len(s.tokens), n_prompt=s.n_prompt,
                     done=s.done, draft_len=0 if s.done else self.wanted(s),
                     hush=self.cost.hush, sampling=self._sampling, grammar_id=self._grammar_id,
                     your_accepted=s.accepted_by_back.get(back_id, 0))

    def grammar_of(self, session_id: str) -> tuple[str, str] | None:
        """(grammar id, text) of the session, if it is lead's current one and has one."""
        s = self.session
        if s is None or s.id != session_id or not s.params.grammar or self._grammar_id is None:
            return None
        return self._grammar_id, s.params.grammar

    async def wait_state(self, since: int, timeout: float, quiet_session: str | None = None,
                         idle: bool = False) -> None:
        """Long-poll: return once the version passes `since` with news that `wakes` this
        waiter, or at timeout."""
        deadline = time.monotonic() + timeout
        while not (self.version > since and self._wakes(quiet_session, idle)):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that lands as its event is set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._news.wait()

    def _wakes(self, quiet_session: str | None, idle: bool) -> bool:
        s = self.session
        return wakes(s, quiet_session, idle, lambda: self.wanted(s) if s is not None else 0)

    def back_seen(self, back_id: str, address: str = "", kind: str = "",
                  sits_out: bool = False) -> None:
        now = self.clock()
        if self.backs.seen(back_id, now, address, kind, sits_out=sits_out) \
                and self._arrivals.allow("", now):
            self.on_arrival()

    def board_full_for(self, address: str, back_id: str) -> bool:
        """Whether a post from this back would find no place on the board: its address
        holds its share of places already (a back on the board keeps its own)."""
        s = self.session
        return s is not None and self.board.address_full(s.tokens, address, back_id)

    def post_draft(self, session_id: str, start: int, token_ids: list[int],
                   dists: list[Dist] | None, back_id: str, branches: Sequence[Branch] = (),
                   address: str = "", trusted: bool = True,
                   probs: Sequence[float] | None = None) -> bool:
        """Put a back's draft, its main chain and branches, on the board in place of that
        back's last; False if none of it can be verified (or the session is stale). An
        untrusted back's dists are dropped: its drafts are verified as if chosen."""
        self.back_seen(back_id, address)
        s = self.session
        self.metrics.drafts_posted += 1
        if not trusted and (dists or any(b.dists for b in branches)):
            self.metrics.drafts_untrusted += 1
            dists, branches = None, [replace(b, dists=None) for b in branches]
        if s is None or s.done or s.id != session_id:
            self.metrics.drafts_stale += 1
            return False
        main, *rest = post_candidates(back_id, start, token_ids, dists, branches, address,
                                      probs)
        useful = self.board.post(s.tokens, main, rest)
        self.metrics.drafts_stale += 0 if useful else 1
        return useful

    def log_hush(self) -> None:
        """Say when lead starts or stops hushing backs."""
        if self.cost.hush == self._hushed:
            return
        self._hushed = self.cost.hush
        if self._hushed:
            log.info("backs hushed: lead's steps take %.2fx their quiet time while a back "
                     "works, more than even perfect drafts could make up", self.cost.slowdown)
        else:
            log.info("backs asked again: a probe measures what they cost and give")

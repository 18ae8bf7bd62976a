"""The back feed: what backs see of the running sessions, when their news comes, and where
their drafts go (each run's draft board). Lives on the event loop.

The feed listens to the engine's events (lead/decode/events.py: `attach`): a step began,
sessions changed, a session ended. Every back is on the link (lead/backs/link.py), sent
every session's news. A session's grammar goes to a back once (`grammar_of`, GET
/duo/grammar), not in every state: a state names it by `grammar_id`. Only a trusted back's
draft probabilities count.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from lead.backs.limits import LinkSlots, RateLimiter
from lead.backs.registry import BackRegistry
from lead.decode.engine import Engine
from lead.decode.metrics import Metrics
from lead.decode.runs import Run
from lead.decode.session import Session
from lead.drafts.board import DraftBoard, post_candidates
from lead.policy.cost import CostModel
from shared.bounded import ewma
from shared.branch import Branch
from shared.broadcast import Broadcast
from shared.sampling import Dist
from shared.wire.protocol import SamplingParams, SessionState, Stop, grammar_id

log = logging.getLogger("lead")
ARRIVALS_PER_S = 1.0  # how often backs arriving may wake the live panel's streams
ENDED_KEPT = 16  # sessions ended lately, kept for the links' last news of them


def is_news(done: bool, quiet: bool, idle: bool, wanted: Callable[[], int]) -> bool:
    """Whether a change of a session a back knows is news to it on the link: its end always
    is; where the back does not draft for it (`quiet`), only drafts wanted (`wanted`: the
    draft length, asked only where it matters), and nothing while the back sits out (`idle`:
    news of sessions starting and ending only). So a back that drafts nothing costs lead no
    message per token."""
    if done:
        return True
    return not idle and (not quiet or wanted() > 0)


@dataclass
class FeedEntry:
    """A session as backs see it: its board, and its sampling settings without the
    grammar's text (which goes once, by its id)."""

    session: Session
    board: DraftBoard
    version: int = 0  # the feed's version at its last change
    grammar_id: str | None = field(init=False)
    sampling: SamplingParams = field(init=False)

    def __post_init__(self) -> None:
        grammar = self.session.params.grammar
        self.grammar_id = grammar_id(grammar) if grammar else None
        self.sampling = self.session.params.model_copy(update={"grammar": None}) if grammar \
            else self.session.params


class BackFeed:
    def __init__(self, cost: CostModel, metrics: Metrics,
                 on_arrival: Callable[[], None] = lambda: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`on_arrival`: called when a back not heard from recently speaks, at most
        ARRIVALS_PER_S times a second (a back the panel misses shows at its next
        heartbeat); `clock`: when backs are seen (tests give a fake one)."""
        self.cost, self.metrics, self.on_arrival, self.clock = cost, metrics, on_arrival, clock
        self.backs = BackRegistry()
        self.links = LinkSlots()
        self._arrivals = RateLimiter(ARRIVALS_PER_S)
        self.followed: dict[str, FeedEntry] = {}  # running sessions, oldest first
        self.ended: deque[FeedEntry] = deque(maxlen=ENDED_KEPT)
        self.news = Broadcast()  # bumped on every change backs are shown
        self.lead_id = uuid.uuid4().hex[:12]  # versions restart with the process; this does not
        self._hushed = False  # as last logged
        self._began: tuple[float, float] | None = None  # (when, price) of the step under way
        self._between: float | None = None  # lead's own seconds between steps, past the price

    @property
    def version(self) -> int:
        return self.news.version

    # --- the engine's events (lead/decode/events.py) ---
    def sessions_changed(self, runs: Sequence[Run]) -> None:
        """News of these runs: each new one followed from now on."""
        for run in runs:
            if run.session.id not in self.followed and not run.session.done:
                self.followed[run.session.id] = FeedEntry(run.session, run.board)
        self.notify([run.session.id for run in runs])

    def session_ended(self, run: Run) -> None:
        self.backs.credit(run.session.drafted_by_back, run.session.accepted_by_back)
        self.end(run.session)

    def step_began(self, seconds: float | None) -> None:
        """Lead began a step it prices at `seconds` (None: unpriced, or no step). Lead
        takes its next draft as it plans the step after, later than the price by what its
        own work between steps takes: measured here, from one step's start to the next.
        Whether lead hushes backs is read here too (once a step)."""
        now = self.clock()
        if seconds is not None and self._began is not None:
            at, price = self._began
            between = now - at - price
            if 0.0 <= between <= price:  # (not a pause, nor a step far off its price)
                self._between = ewma(self._between, between, 0.2)
        self._began = (now, seconds) if seconds is not None else None
        self.log_hush()

    # --- sessions ---
    def start(self, session: Session, board: DraftBoard | None = None) -> None:
        """Follow `session`, its drafts going to `board` (a run's; tests: a fresh one over
        every drafter's record)."""
        board = DraftBoard(scores=self.cost.scores) if board is None else board
        self.followed[session.id] = FeedEntry(session, board, self.version)
        self.notify([session.id])

    def end(self, session: Session) -> None:
        followed = self.followed.pop(session.id, None)
        if followed is None:
            return
        self.ended.append(followed)
        self.notify([session.id])

    def board_of(self, session_id: str) -> DraftBoard | None:
        followed = self.followed.get(session_id)
        return followed.board if followed is not None else None

    def draft_len(self, session: Session) -> int:
        """The draft length backs are asked for now."""
        return self.cost.draft_len(first=session.n_generated == 0)

    def drafting(self) -> bool:
        """Whether a back drafts when asked, so that a step's price counts as busy (a back
        sitting out slows nothing: its steps are quiet ones)."""
        return self.backs.drafting(now=self.clock()) > 0

    def back_drafting(self, session: Session) -> bool:
        """Whether a back drafts during a step of `session`."""
        return self.drafting() and self.draft_len(session) > 0

    def step_left(self) -> float | None:
        """Seconds until the step under way is due to end (None: no step priced)."""
        if self._began is None:
            return None
        at, price = self._began
        return round(max(at + price + (self._between or 0.0) - self.clock(), 0.0), 6)

    def notify(self, changed: Iterable[str] = ()) -> None:
        """News: the sessions `changed` (or started, or ended) have it."""
        version = self.news.bump()
        for sid in changed:
            followed = self.followed.get(sid) or self._ended(sid)
            if followed is not None:
                followed.version = version

    def _ended(self, session_id: str) -> FeedEntry | None:
        return next((f for f in self.ended if f.session.id == session_id), None)

    def session_state(self, followed: FeedEntry, offset: int, back_id: str,
                      sampling: bool = True) -> SessionState:
        """The session's news for a back holding `offset` of its tokens (`sampling`: with
        its settings)."""
        s = followed.session
        offset = min(max(offset, 0), len(s.tokens))
        draft_len, stop = (0, Stop.DONE) if s.done else \
            self.cost.asked(first=s.n_generated == 0)
        return SessionState(session_id=s.id, offset=offset, token_ids=s.tokens[offset:],
                            n_tokens=len(s.tokens), n_prompt=s.n_prompt, done=s.done,
                            draft_len=draft_len, stop=stop,
                            sampling=followed.sampling if sampling else None,
                            grammar_id=followed.grammar_id,
                            your_accepted=s.accepted_by_back.get(back_id, 0))

    def grammar_of(self, session_id: str) -> tuple[str, str] | None:
        """(grammar id, text) of the session, if it runs and has one."""
        followed = self.followed.get(session_id)
        if followed is None or followed.grammar_id is None or not followed.session.params.grammar:
            return None
        return followed.grammar_id, followed.session.params.grammar

    async def wait_news(self, since: int, timeout: float,
                        wakes_me: Callable[[], bool] = lambda: True) -> None:
        """Return once the version passes `since` with news that `wakes_me`, or at timeout."""
        await self.news.wait(lambda: self.version > since and wakes_me(), timeout)

    # --- backs and their drafts ---
    def back_seen(self, back_id: str, address: str = "", kind: str = "",
                  sits_out: bool = False) -> None:
        now = self.clock()
        if self.backs.seen(back_id, now, address, kind, sits_out=sits_out) \
                and self._arrivals.allow("", now):
            self.on_arrival()

    def board_full_for(self, address: str, back_id: str, session_id: str) -> bool:
        """Whether a post from this back would find no place on the session's board: its
        address holds its share of places already (a back on the board keeps its own)."""
        followed = self.followed.get(session_id)
        return followed is not None and followed.board.address_full(
            followed.session.tokens, address, back_id)

    def post_draft(self, session_id: str, start: int, token_ids: list[int],
                   dists: list[Dist] | None, back_id: str, branches: Sequence[Branch] = (),
                   address: str = "", trusted: bool = True,
                   probs: Sequence[float] | None = None) -> bool:
        """Put a back's draft, its main chain and branches, on the session's board in place
        of that back's last; False if none of it can be verified (or the session is not
        running). An untrusted back's dists are dropped: its drafts are verified as if
        chosen."""
        self.back_seen(back_id, address)
        followed = self.followed.get(session_id)
        self.metrics.drafts_posted += 1
        if not trusted and (dists or any(b.dists for b in branches)):
            self.metrics.drafts_untrusted += 1
            dists, branches = None, [replace(b, dists=None) for b in branches]
        if followed is None or followed.session.done:
            self.metrics.drafts_stale += 1
            return False
        main, *rest = post_candidates(back_id, start, token_ids, dists, branches, address,
                                      probs)
        useful = followed.board.post(followed.session.tokens, main, rest)
        self.metrics.drafts_stale += 0 if useful else 1
        return useful

    def log_hush(self) -> None:
        """Say when lead starts or stops hushing backs (news of every session: its `stop`)."""
        if self.cost.hush == self._hushed:
            return
        self._hushed = self.cost.hush
        self.notify(list(self.followed))
        if self._hushed:
            log.info("backs hushed: lead's steps take %.2fx their quiet time while a back "
                     "works, more than even perfect drafts could make up",
                     self.cost.prices.slowdown)
        else:
            log.info("backs asked again: a probe measures what they cost and give")


def attach(engine: Engine, on_arrival: Callable[[], None] = lambda: None,
           clock: Callable[[], float] = time.monotonic) -> BackFeed:
    """A feed following `engine`'s sessions, told its events; backs drafting count in its
    step prices (`on_arrival`, `clock`: BackFeed's)."""
    feed = BackFeed(engine.cost, engine.metrics, on_arrival, clock)
    engine.events.subscribe(feed)
    engine.backs_drafting = feed.drafting
    return feed

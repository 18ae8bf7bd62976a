"""The back's bookkeeping of lead's sessions: what it did for each, and for all.

Owned by the event loop. Model-thread jobs never touch it: they return a `Work`, which
the event loop adds to the stats of the session the job was started for (back/follower.py),
if that session is still followed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields

RECENT = 32  # sessions kept for inspection; totals cover all of them


@dataclass(frozen=True)
class Work:
    """What one model-thread job did."""

    caught_up: int = 0  # lead's tokens evaluated
    catch_up_s: float = 0.0
    cut_short: int = 0  # draft evaluations stopped midway: lead had left their path
    branch_grown: int = 0  # branch tokens drafted


@dataclass
class SessionStats:
    session_id: str
    catch_up_s: float = 0.0
    caught_up: int = 0
    drafted: int = 0  # draft tokens posted (each counted once, however often re-posted)
    posts: int = 0
    accepted: int = 0  # as lead reports back
    cut_short: int = 0
    branch_grown: int = 0

    def add(self, work: Work) -> None:
        for f in fields(work):
            setattr(self, f.name, getattr(self, f.name) + getattr(work, f.name))

    def line(self) -> str:
        share = f" ({100 * self.accepted / self.drafted:.0f}%)" if self.drafted else ""
        branches = f"; branch tokens drafted: {self.branch_grown}" if self.branch_grown else ""
        return (f"session {self.session_id}: caught up {self.caught_up} tokens in "
                f"{self.catch_up_s:.2f} s; drafted {self.drafted} in {self.posts} posts, "
                f"accepted {self.accepted}{share}; dead drafts cut short: {self.cut_short}"
                f"{branches}")


@dataclass
class Totals:
    """Sums over every session that ended."""

    sessions: int = 0
    caught_up: int = 0
    drafted: int = 0
    posts: int = 0
    accepted: int = 0

    def add(self, stats: SessionStats) -> None:
        self.sessions += 1
        for f in fields(self):  # each, but `sessions`, a count of SessionStats'
            if f.name != "sessions":
                setattr(self, f.name, getattr(self, f.name) + getattr(stats, f.name))

    def line(self) -> str:
        sessions = f"{self.sessions} session{'' if self.sessions == 1 else 's'}"
        return (f"{sessions}, {self.caught_up} tokens caught up; drafted "
                f"{self.drafted} in {self.posts} posts, accepted {self.accepted}")


class History:
    """The last few sessions that ended, and totals over all of them."""

    def __init__(self, keep: int = RECENT) -> None:
        self.recent: deque[SessionStats] = deque(maxlen=keep)
        self.totals = Totals()

    def ended(self, stats: SessionStats) -> None:
        self.recent.append(stats)
        self.totals.add(stats)

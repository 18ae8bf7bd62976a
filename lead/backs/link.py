"""The link: one WebSocket per back (GET /duo/link, docs/protocol.md), news pushed each way
instead of a request per state and per draft. Lead sends a back an `Update` whenever
sessions it wants news of change (what it wants: `idle`, `quiet`, `ignored` in its
`Hello`): for each, only the tokens it has not been sent (its sampling settings in the
first). Its drafts (`Posted`) are checked (lead/backs/intake.py); a refused one is answered
with `Refused`, an accepted one with nothing (the next update says what came of it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lead.backs.feed import BackFeed, FeedEntry, is_news
from shared.wire.protocol import Hello, SessionState, Update


@dataclass
class LinkedBack:
    """One back on the link: what it has been sent of each session, and what it wants."""

    feed: BackFeed
    back_id: str = ""
    idle: bool = False  # it sits out: sessions starting and ending only
    quiet: frozenset[str] = frozenset()  # sessions it does not draft for now
    ignored: frozenset[str] = frozenset()  # sessions it does not follow
    sent: dict[str, int] = field(default_factory=dict)  # session id -> tokens sent
    version: int = -1  # the feed's version at the last update
    greeted: bool = False  # the back said hello: news may go out

    def hello(self, hello: Hello) -> None:
        self.greeted = True
        self.back_id, self.idle = hello.back_id, hello.idle  # (its kind: the registry's)
        self.quiet, self.ignored = frozenset(hello.quiet), frozenset(hello.ignored)

    def has_news(self) -> bool:
        """Whether an update now would carry anything."""
        feed = self.feed
        if self.version < 0 or any(sid not in feed.followed for sid in self.sent):
            return True  # (the first at once: the back learns the version it is at)
        return any(self._wants(f) for f in feed.followed.values())

    def _wants(self, followed: FeedEntry) -> bool:
        sid = followed.session.id
        if sid not in self.sent:
            return True  # new to this back
        if followed.version <= self.version or sid in self.ignored:
            return False
        return is_news(followed.session.done, sid in self.quiet, self.idle,
                       lambda: self.feed.draft_len(followed.session))

    def update(self) -> Update | None:
        """The news since the last update (None: none this back wants)."""
        feed = self.feed
        if not self.has_news():
            return None
        sessions = [self._state(f) for f in feed.followed.values() if self._wants(f)]
        gone = {sid: n for sid, n in self.sent.items() if sid not in feed.followed}
        for sid in gone:
            del self.sent[sid]
        final = {f.session.id: f for f in feed.ended if f.session.id in gone}
        sessions += [feed.session_state(f, gone[sid], self.back_id, sampling=False)
                     for sid, f in final.items()]  # its last tokens, done
        self.version = feed.version
        return Update(version=feed.version, lead_id=feed.lead_id, sessions=sessions,
                      ended=[sid for sid in gone if sid not in final],
                      step_left_s=feed.step_left())

    def heartbeat(self) -> Update:
        """An update with no news, to show the link is alive."""
        return Update(version=self.version, lead_id=self.feed.lead_id)

    def _state(self, followed: FeedEntry) -> SessionState:
        sid = followed.session.id
        first = sid not in self.sent
        state = self.feed.session_state(followed, self.sent.get(sid, 0), self.back_id, first)
        self.sent[sid] = state.n_tokens
        return state

"""The back's copy of lead's state, kept from the states lead sends (pure: no I/O, no threads;
splicing and stale states: docs/back-loop.md). From its copy it says whether the back
follows a session, whether it should draft for it, and where a draft continues lead.

A state names its session's grammar by `grammar_id`; the text comes once per session
(`hold_grammar`) and the mirror puts it back into every state's `sampling`, as lead's
request holds it. It drafts for a session only once it holds that text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from shared.bounded import Lru
from shared.wire.protocol import State

GRAMMARS_KEPT = 8  # grammar texts held, by id, as many as the drafter keeps parsed


class LeadMirror:
    def __init__(self, fits: Callable[[int], bool] = lambda _: True) -> None:
        self.fits = fits  # whether the draft model holds this many tokens and a draft
        self.state = State(version=-1)
        self.tokens: tuple[int, ...] = ()  # lead's; replaced whole (jobs.leaving reads it)
        # a session sat out: more than the draft model holds, its grammar is gone, or the
        # draft model failed on it
        self.skipped: str | None = None
        self.grammars: Lru[str, str] = Lru(GRAMMARS_KEPT)  # grammar id -> text

    def take(self, state: State) -> bool:
        """Take `state` (its tokens from `state.offset` on); False where it is older than one
        taken, or starts past the tokens held, where splicing would garble them (the link
        sends each token once, in order: neither happens there)."""
        held = self.tokens if state.session_id == self.state.session_id else ()
        if state.version < self.state.version or state.offset > len(held):
            return False
        self.tokens = held[:state.offset] + tuple(state.token_ids)
        self.state = self._with_grammar(state)
        return True

    def outgrew(self) -> bool:
        """Whether the session just became longer than the draft model holds (it is sat out
        from here on)."""
        if self._live and not self.fits(len(self.tokens)):
            self.skipped = self.state.session_id
            return True
        return False

    def missing_grammar(self) -> str | None:
        """The id of the followed session's grammar where its text is not held yet."""
        gid = self.state.grammar_id
        return gid if self._live and gid not in self.grammars else None

    def hold_grammar(self, gid: str, text: str) -> None:
        self.grammars[gid] = text
        self.state = self._with_grammar(self.state)

    def _with_grammar(self, state: State) -> State:
        """`state` with its grammar's text in `sampling`, where the mirror holds it."""
        text = self.grammars.get(state.grammar_id) if state.grammar_id else None
        if text is None or state.sampling.grammar == text:
            return state
        sampling = state.sampling.model_copy(update={"grammar": text})
        return state.model_copy(update={"sampling": sampling})

    @property
    def _live(self) -> bool:
        """A session followed, not over and not sat out."""
        s = self.state
        return s.session_id is not None and not s.done and s.session_id != self.skipped

    @property
    def following(self) -> bool:
        """A live session the back can hold, whose every token it holds."""
        return self._live and len(self.tokens) == self.state.n_tokens > 0

    def should_draft(self, sit_out: bool = False) -> bool:
        return self.following and self.state.stop is None and not sit_out \
            and self.missing_grammar() is None

    def quiet(self, sit_out: bool = False) -> str:
        """The session to ask lead to be quiet of (news of it only when it wants drafts, or
        ends where `sit_out`): a live one this back does not draft for now; else ''."""
        s = self.state
        if s.session_id and not s.done and (
                s.stop is not None or s.session_id == self.skipped or sit_out):
            return s.session_id
        return ""

    def draft_past(self, local: Sequence[int]) -> list[int] | None:
        """What `local` (a drafter's sequence) holds past lead's tokens; None where it does
        not hold them (what lies past them was drafted on a path lead left), or where no
        live session is followed: past no tokens, anything would read as a draft."""
        n = len(self.tokens)
        if not self.following or len(local) < n or tuple(local[:n]) != self.tokens:
            return None
        return list(local[n:])

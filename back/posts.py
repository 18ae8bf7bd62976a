"""What the back posted in the session it follows, and the draft distributions it may post."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shared.protocol import DraftDist, DraftPost


class PostBook:
    def __init__(self) -> None:
        self._last: tuple[int, tuple[int, ...]] = (0, ())  # (start, token ids) last posted
        self._dists: dict[int, DraftDist] = {}  # drafter position -> its draft distribution

    def new_session(self) -> None:
        # Another session may share the drafter's path (the same prompt again): the tokens
        # there are then the last session's, not guesses drawn from these distributions.
        self._last, self._dists = (0, ()), {}

    def drafted(self, n_lead: int, kept: int, dists: Mapping[int, DraftDist]) -> None:
        """A draft job's result: lead held `n_lead` tokens, the drafter's positions from
        `kept` on were redrafted, and `dists` holds the distributions of the new guesses
        that have one. Below `n_lead` the tokens are lead's (maybe its correction of a
        guess): their distributions no longer say how those tokens were drawn."""
        self._dists = {p: d for p, d in self._dists.items() if n_lead <= p < kept}
        self._dists.update(dists)

    def next_post(self, session_id: str, start: int, draft: Sequence[int], back_id: str,
                  with_dists: bool = True) -> tuple[DraftPost, int] | None:
        """The post of `draft` (lead's tokens end at `start`) and how many of its tokens
        no post carried before; None if it is empty or was posted already."""
        draft = list(draft)
        if not draft or self._already_posted(start, draft):
            return None
        positions = range(start, start + len(draft))
        dists = [self._dists[p] for p in positions] if with_dists and \
            all(p in self._dists for p in positions) else None
        last_start, last = self._last
        new = max(0, start + len(draft) - max(last_start + len(last), start))
        self._last = (start, tuple(draft))
        return DraftPost(session_id=session_id, start=start, token_ids=draft, back_id=back_id,
                         dists=dists), new

    def _already_posted(self, start: int, draft: list[int]) -> bool:
        last_start, last = self._last
        skip = start - last_start
        return skip >= 0 and list(last[skip: skip + len(draft)]) == draft

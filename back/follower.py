"""One session the back follows: its copy of lead's state, its stats, what it posted, its
draft generator and the slot of the draft model it drafts on. Event loop only: model-thread
jobs get a `DraftJob` made here and give back a `Drafted`, which `took` takes in.
"""

from __future__ import annotations

import numpy as np

from back.jobs import Drafted, DraftJob, ahead_for
from back.mirror import LeadMirror
from back.posts import PostBook
from back.stats import SessionStats
from back.width import StepClock
from shared.sampling import make_draft_rng
from shared.wire.protocol import DraftPost, State

TRANSIT_S = 0.0005  # a post's way to lead's board, allowed for before its step ends


class Follower:
    def __init__(self, session_id: str, slot: int, mirror: LeadMirror, seed: int | None,
                 step_s: float | None = None) -> None:
        """`step_s`: lead's step as measured before this session (None: not yet)."""
        self.session_id, self.slot, self.mirror = session_id, slot, mirror
        self.stats = SessionStats(session_id)
        self.posts = PostBook()
        self.rng: np.random.Generator = make_draft_rng(seed)
        self.lead_step = StepClock(step_s)  # lead's step time, from this session's states
        self._step_posted: float | None = None  # the step end a post was last made for

    def take(self, state: State, now: float) -> bool:
        """Take a state of this session (from an update on the link); whether the session
        just became longer than the draft model holds."""
        if not self.mirror.take(state):
            return False
        self.lead_step.note(len(self.mirror.tokens), now, state.step_left_s)
        self.stats.accepted = max(self.stats.accepted, state.your_accepted)
        return self.mirror.outgrew()

    def job(self, max_post: int, eos: frozenset[int], width: int, to_post: bool = False
            ) -> DraftJob:
        """The next job, drafting as far ahead as lead asks in one hop to the model thread
        and back; `to_post` (a model drafter): only as far as its next post is due, or until
        it must leave to reach lead's step's end."""
        state = self.mirror.state
        ahead = ahead_for(state.draft_len, max_post)
        stop_at, until = 0, None
        if to_post:
            stop_at = self._due_size(len(self.mirror.tokens), ahead)
            ends = self.lead_step.ends_at()
            until = ends - TRANSIT_S if ends is not None else None
        return DraftJob(self.mirror.tokens, state.sampling, ahead, ahead, eos, self.rng,
                        self.mirror, n_prompt=state.n_prompt, width=width,
                        depth=min(max(1, state.draft_len), max_post - 1), stop_at=stop_at,
                        until=until)

    def took(self, job: DraftJob, drafted: Drafted) -> None:
        """What a draft job did for this session."""
        self.stats.add(drafted.work)
        self.posts.drafted(len(job.lead_tokens), drafted.kept, drafted.dists, drafted.probs)

    def post(self, drafted: Drafted, back_id: str, max_post: int, send_dists: bool,
             ahead: int | None = None, next_job_ends: float | None = None
             ) -> DraftPost | None:
        """The post of what `drafted` holds past lead's tokens, if anything new is due; none
        of a draft on a path lead has left (it would read as a fresh draft). With `ahead`, a
        draft is posted as it doubles up to `ahead`, and once more a lead step where that
        step ends before the next job would (`next_job_ends`, on the clock of `take`'s
        `now`): docs/back-loop.md, "Posting without waiting"."""
        draft = self.mirror.draft_past(drafted.local)
        if draft is None:
            return None
        start = len(self.mirror.tokens)
        if ahead is not None and drafted.changed and len(draft) < self._due_size(start, ahead) \
                and not self._step_ends_before(next_job_ends):
            return None
        made = self.posts.next_post(self.session_id, start, draft[:max_post], back_id,
                                    send_dists, drafted.branches, max_post)
        if made is None:
            return None
        post, new_tokens = made
        self.stats.posts += 1
        self.stats.drafted += new_tokens
        return post

    def _step_ends_before(self, when: float | None) -> bool:
        ends = self.lead_step.ends_at()
        if when is None or ends is None or ends > when or ends == self._step_posted:
            return False
        self._step_posted = ends
        return True

    def _due_size(self, start: int, ahead: int) -> int:
        """The draft tokens past lead's `start` that make the next post due: twice what the
        last post at this start held (its first guess at once), or all the back drafts."""
        at, last = self.posts.last
        return min(ahead, max(1, 2 * len(last) if at == start else 1))

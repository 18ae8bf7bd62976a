"""The back's drafting for the sessions that want drafts: one model call a guess for all
of them (several sessions' guesses in one), posting as the draft doubles and before lead's
step ends (docs/back-loop.md). The Worker (back/worker.py) holds one and says which
sessions to draft for; like it, on the event loop, handing the model thread jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from back import jobs
from back.drafter import Drafter
from back.failures import ModelFailed, brief
from back.follower import Follower
from back.leadlink import Link
from back.width import DraftPrices, choose_width
from shared.modelthread import ModelThread
from shared.wire.protocol import Stop

log = logging.getLogger("back")
T = TypeVar("T")
Followers = Mapping[str, Follower]  # the sessions followed, by id (the Worker's)


class DraftBatcher:
    """The draft model's slots (a drafter each) and its thread; lead's terms for a post;
    how many branches pay beside a draft."""

    def __init__(self, drafters: list[Drafter], model: Any, back_id: str,
                 max_post: int) -> None:
        """`drafters`: one per slot of the draft model (`model`, whose `evaluate_many_slots`
        grows several sessions' drafts in one call); `max_post`: the most tokens a post
        holds until lead says (`attached`)."""
        self.drafters = drafters
        self.model = model
        self.back_id, self.max_post = back_id, max_post
        self.eos_token_ids: frozenset[int] = frozenset()
        self.send_dists = True
        self.branches = 0  # most branches grown beside a draft (0: the main chain only)
        self.prices = DraftPrices()  # the draft model's seconds per call, by batch size
        self._width = 0  # the last width chosen (logged when it changes)
        self.model_thread = ModelThread("draft")

    def attached(self, max_post: int, eos_token_ids: frozenset[int]) -> None:
        """Lead's terms, told at a handshake: the most tokens a post holds, its end tokens."""
        self.max_post, self.eos_token_ids = max_post, eos_token_ids

    async def draft_once(self, drafting: list[Follower], followers: Followers,
                         link: Link | None) -> bool:
        """One job for `drafting`, and its posts on `link`; whether it changed anything."""
        work = [(f, f.job(self.max_post, self.eos_token_ids, self.width(f, len(drafting)),
                          not self.drafters[f.slot].free))
                for f in drafting]
        began = time.monotonic()
        results = await self._on_model(followers, [f.session_id for f in drafting],
                                       jobs.extend_many, self.model,
                                       [(f.slot, self.drafters[f.slot], job) for f, job in work])
        now = time.monotonic()
        next_job_ends = now + 1.5 * (now - began)  # (the next job as long as this one, and
        # room for its times varying by half)
        changed = False
        for (follower, job), drafted in zip(work, results, strict=True):
            if followers.get(follower.session_id) is not follower:
                continue  # it ended meanwhile: its work is dropped
            follower.took(job, drafted)
            for tokens, seconds in drafted.calls:
                self.prices.note(tokens, seconds)
            post = follower.post(drafted, self.back_id, self.max_post, self.send_dists,
                                 job.ahead, next_job_ends)
            if post is not None and link is not None:
                await link.post(post)
            changed = changed or drafted.changed or post is not None
        return changed

    async def catch_up(self, followers: Followers) -> None:
        """Lead's tokens taken in for every session followed but one lead says its backs
        slow (Stop.SLOWED)."""
        for follower in [f for f in followers.values()
                         if f.mirror.following and f.mirror.state.stop != Stop.SLOWED]:
            done = await self._on_model(followers, [follower.session_id], jobs.catch_up,
                                        self.drafters[follower.slot], follower.mirror.tokens)
            if followers.get(follower.session_id) is follower:
                follower.stats.add(done)

    async def _on_model(self, followers: Followers, sessions: list[str],
                        fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the model thread; its failure is these sessions' (ModelFailed)."""
        try:
            return await self.model_thread.run(fn, *args)
        except Exception as exc:
            log.warning("the draft model failed (%s); not drafting for session %s", brief(exc),
                        ", ".join(sessions))
            for sid in sessions:
                if (follower := followers.get(sid)) is not None:
                    follower.mirror.skipped = sid
            raise ModelFailed(brief(exc)) from exc

    def width(self, follower: Follower, sharing: int) -> int:
        """Branches to grow beside a session's draft: as many as the draft's measured price
        per call leaves it time for in lead's measured step (back/width.py); none where
        several sessions (`sharing`) share a call."""
        drafter = self.drafters[follower.slot]
        if not (self.branches and self.max_post > 1 and drafter.can_branch and sharing == 1):
            return 0
        width = choose_width(self.prices, follower.lead_step.step_s,
                             jobs.ahead_for(follower.mirror.state.draft_len, self.max_post),
                             self.branches)
        if width != self._width:
            log.debug("branches: %d (draft call %s; lead step %s s)", width,
                      self.prices, follower.lead_step.step_s)
            self._width = width
        return width

"""A session the back follows (its stats, generator, posts) and the history of those ended."""

from __future__ import annotations

import pytest

from back.follower import TRANSIT_S, Follower
from back.jobs import Drafted
from back.mirror import LeadMirror
from back.stats import History, SessionStats, Work
from shared.sampling import make_draft_rng
from shared.wire.protocol import SamplingParams, State


def follower(session_id: str = "a", seed: int | None = None) -> Follower:
    return Follower(session_id, 0, LeadMirror(), seed)


def state(version: int, tokens: list[int], accepted: int = 0, sid: str = "a") -> State:
    return State(version=version, lead_id="L", session_id=sid, token_ids=tokens,
                 n_tokens=len(tokens), done=False, draft_len=2, your_accepted=accepted,
                 sampling=SamplingParams())


def test_each_session_drafts_from_its_seeds_own_stream() -> None:
    a, b = follower("a", seed=7), follower("b", seed=8)
    assert a.rng is not b.rng
    assert a.rng.random() == make_draft_rng(7).random()
    assert b.rng.random() == make_draft_rng(8).random()


def test_posts_count_new_tokens_and_lead_counts_acceptance_never_down() -> None:
    f = follower()
    assert f.take(state(1, [1, 2, 3], accepted=2), now=0.0) is not None
    drafted = Drafted(Work(), 3, (1, 2, 3, 7, 8, 9), 3, {})
    post = f.post(drafted, "b", max_post=8, send_dists=False)
    assert post is not None and post.start == 3 and post.token_ids == [7, 8, 9]
    assert f.post(drafted, "b", max_post=8, send_dists=False) is None  # posted already
    longer = Drafted(Work(), 1, (1, 2, 3, 7, 8, 9, 4), 6, {})
    again = f.post(longer, "b", max_post=8, send_dists=False)
    assert again is not None and again.token_ids == [7, 8, 9, 4]  # the whole draft again
    f.take(state(2, [1, 2, 3], accepted=1), now=0.1)  # an older count: never down
    assert (f.stats.drafted, f.stats.posts, f.stats.accepted) == (4, 2, 2)
    assert "drafted 4 in 2 posts, accepted 2 (50%)" in f.stats.line()


def test_a_draft_on_a_path_lead_left_is_not_posted() -> None:
    f = follower()
    f.take(state(1, [1, 2, 3]), now=0.0)
    f.take(state(2, [1, 2, 3, 5]), now=0.1)  # lead rejected what the drafter still holds
    assert f.post(Drafted(Work(), 2, (1, 2, 3, 7, 8), 3, {}), "b", 8, False) is None


def test_work_adds_to_the_session_it_was_done_for() -> None:
    f = follower()
    f.take(state(1, [1, 2]), now=0.0)
    job = f.job(max_post=8, eos=frozenset({0}), width=0)
    f.took(job, Drafted(Work(caught_up=5, catch_up_s=0.5, cut_short=1), 1, (1, 2, 7), 2, {}))
    assert (f.stats.caught_up, f.stats.cut_short) == (5, 1)
    assert job.lead_tokens == (1, 2) and job.rng is f.rng


def test_only_a_few_ended_sessions_are_kept_and_totals_count_all() -> None:
    history = History(keep=3)
    for i in range(10):
        history.ended(SessionStats(f"s{i}", drafted=2, posts=1, accepted=1))
    assert [s.session_id for s in history.recent] == ["s7", "s8", "s9"]
    totals = history.totals
    assert (totals.sessions, totals.drafted, totals.posts, totals.accepted) == (10, 20, 10, 10)


def test_a_growing_draft_is_posted_as_it_doubles_and_once_it_stops() -> None:
    f = follower()
    f.take(state(1, [1, 2, 3]), now=0.0)
    posted = []
    for n in range(1, 13):  # a guess a job, to 12 tokens past lead (`ahead`)
        drafted = Drafted(Work(), 1, (1, 2, 3, *range(10, 10 + n)), 3, {})
        if (post := f.post(drafted, "b", 16, False, ahead=12)) is not None:
            posted.append(len(post.token_ids))
    assert posted == [1, 2, 4, 8, 12]
    f.take(state(2, [1, 2, 3, 10]), now=0.1)  # lead took a token: the doubling starts over
    post = f.post(Drafted(Work(), 1, (1, 2, 3, *range(10, 23)), 4, {}), "b", 16, False, 12)
    assert post is not None and len(post.token_ids) == 12
    f.take(state(3, [1, 2, 3, 10, 11]), now=0.2)
    stopped = Drafted(Work(), 0, (1, 2, 3, 10, 11, 30, 31), 5, {})  # it grows no more
    tail = f.post(stopped, "b", 16, False, 12)
    assert tail is not None and tail.token_ids == [30, 31]  # posted, short of doubling


def test_a_draft_short_of_doubling_is_posted_once_before_lead_s_step_ends() -> None:
    f = follower()
    for n, at in ((3, 0.0), (4, 1.0), (5, 1.01)):  # lead steps every 10 ms
        f.take(state(n, list(range(1, n + 1))), now=at)
    assert f.lead_step.ends_at() == pytest.approx(1.02)

    def grown(n: int, next_job_ends: float) -> int | None:
        drafted = Drafted(Work(), 1, (*range(1, 6), *range(10, 10 + n)), 5, {})
        post = f.post(drafted, "b", 16, False, ahead=12, next_job_ends=next_job_ends)
        return len(post.token_ids) if post is not None else None

    assert [grown(n, 1.011 + n / 1000) for n in (1, 2, 3)] == [1, 2, None]  # as it doubles
    assert grown(4, 1.016) == 4
    assert grown(5, 1.018) is None  # the step ends after the next job: no hurry
    assert grown(6, 1.021) == 6  # it ends before: what the back holds goes now
    assert grown(7, 1.022) is None  # once a step
    f.take(state(6, [1, 2, 3, 4, 5, 10]), now=1.02)  # lead took a token: the next step
    assert grown(8, 1.0215) == 7  # (a first post past lead's new length: 7 tokens)
    assert grown(9, 1.0225) is None  # short of doubling, and the step ends at 1.03
    assert grown(10, 1.031) == 9


def test_a_job_drafts_up_to_its_next_post_and_to_leave_before_lead_s_step_ends() -> None:
    f = follower()
    lead = [1, 2, 3]
    f.take(state(1, lead).model_copy(update={"step_left_s": 0.05}), now=2.0)
    first = f.job(16, frozenset(), 0, to_post=True)
    ahead = first.ahead
    assert (first.burst, first.stop_at) == (ahead, 1)  # the first guess goes at once
    assert first.until == pytest.approx(2.05 - TRANSIT_S)  # and nothing past lead's step
    post = f.post(Drafted(Work(), 3, (*lead, 7, 8, 9), 3, {}), "b", 16, False, ahead)
    assert post is not None and len(post.token_ids) == 3
    assert f.job(16, frozenset(), 0, to_post=True).stop_at == 6  # then as it doubles
    plain = f.job(16, frozenset(), 0)  # not a model drafter's: as far as lead asks
    assert (plain.burst, plain.stop_at, plain.until) == (plain.ahead, 0, None)

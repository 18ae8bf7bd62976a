"""Sessions: the back's per-session stats and draft generators."""

from __future__ import annotations

from back.sessions import Sessions, Work
from shared.sampling import make_draft_rng


def test_work_counts_for_the_session_it_was_started_for_only() -> None:
    sessions = Sessions()
    a = sessions.start("a", seed=None)
    assert sessions.add(a, Work(caught_up=5, catch_up_s=0.5))
    b = sessions.start("b", seed=None)  # a ends
    assert not sessions.add(a, Work(caught_up=7, cut_short=1))  # a's job came back late
    assert (a.caught_up, a.cut_short, b.caught_up, b.cut_short) == (5, 0, 0, 0)
    sessions.end()
    assert not sessions.add(b, Work(caught_up=1))  # b's job came back after b ended
    assert not sessions.add(None, Work(caught_up=1))
    assert [s.caught_up for s in sessions.recent] == [5, 0]


def test_each_session_drafts_from_its_seeds_own_stream() -> None:
    sessions = Sessions()
    sessions.start("a", seed=7)
    a_rng = sessions.rng
    sessions.start("b", seed=8)
    assert sessions.rng is not a_rng
    assert a_rng.random() == make_draft_rng(7).random()
    assert sessions.rng.random() == make_draft_rng(8).random()


def test_posts_and_acceptance_count_for_the_current_session() -> None:
    sessions = Sessions()
    sessions.posted(3)  # no session: nowhere to count
    sessions.accepted(2)
    stats = sessions.start("a", seed=None)
    sessions.posted(3)
    sessions.posted(1)
    sessions.accepted(2)
    sessions.accepted(1)  # an older reply: lead's count never goes down
    assert (stats.drafted, stats.posts, stats.accepted) == (4, 2, 2)
    assert "drafted 4 in 2 posts, accepted 2 (50%)" in stats.line()


def test_only_a_few_ended_sessions_are_kept_and_totals_count_all() -> None:
    sessions = Sessions(keep=3)
    for i in range(10):
        sessions.start(f"s{i}", seed=None)
        sessions.posted(2)
        sessions.accepted(1)
    assert sessions.end() is not None and sessions.end() is None
    assert [s.session_id for s in sessions.recent] == ["s7", "s8", "s9"]
    totals = sessions.totals
    assert (totals.sessions, totals.drafted, totals.posts, totals.accepted) == (10, 20, 10, 10)

"""The back's model-thread jobs: catching up and drafting, on fake draft models."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest

from back.drafter import ModelDrafter, NgramDrafter
from back.jobs import DraftJob, ahead_for, catch_up, extend_many, leaving
from back.mirror import LeadMirror
from back.posts import PostBook
from bench.fake import EOS, FakeModel
from shared.wire.protocol import SamplingParams, State
from tests.conftest import extend

GREEDY = SamplingParams()


def job(lead_tokens: Sequence[int], latest: LeadMirror | None = None, burst: int = 1,
        draft_len: int = 3, sampling: SamplingParams = GREEDY, seed: int = 0) -> DraftJob:
    tokens = tuple(lead_tokens)
    if latest is None:
        latest = LeadMirror()
        latest.tokens = tokens
    return DraftJob(tokens, sampling, ahead_for(draft_len, 16), burst, frozenset({EOS}),
                    np.random.default_rng(seed), latest)


def test_catching_up_counts_the_tokens_it_evaluated() -> None:
    model = FakeModel(salt="draft")
    drafter = ModelDrafter(model)
    first = catch_up(drafter, [1, 2, 3, 4])
    assert first.caught_up == 4 == model.evaluated and first.catch_up_s >= 0
    again = catch_up(drafter, [1, 2, 3, 4])
    assert again.caught_up == 0 and again.catch_up_s == 0.0  # nothing new: no work
    assert catch_up(drafter, [1, 2, 3, 4, 5, 6]).caught_up == 2


def test_a_draft_stays_within_two_steps_of_lead_and_stops_at_eos() -> None:
    assert ahead_for(draft_len=3, max_post=16) == 8 and ahead_for(10, 16) == 16
    lead = (5, 6, 7) * 10  # n-gram lookup drafts on and on
    drafted = extend(NgramDrafter(), job(lead, burst=100, draft_len=2))
    assert drafted.grown == 6 == len(drafted.local) - len(lead)
    assert drafted.work.caught_up == len(lead) and drafted.kept == len(lead)
    ends = (5, 6, 7, EOS, 5, 6, 7)  # n-gram lookup would go on past EOS
    assert extend(NgramDrafter(), job(ends, burst=100)).local[len(ends):] == (EOS,)


def test_sampled_guesses_carry_their_distributions_greedy_ones_none() -> None:
    hot = SamplingParams(temperature=1.0)
    drafted = extend(ModelDrafter(FakeModel(salt="draft")), job([1, 2, 3], burst=3,
                                                                 sampling=hot))
    assert drafted.grown == 3 and sorted(drafted.dists) == [3, 4, 5]
    for position, dist in drafted.dists.items():
        assert drafted.local[position] in dist.token_ids
    greedy = extend(ModelDrafter(FakeModel(salt="draft")), job([1, 2, 3], burst=3))
    assert greedy.grown == 3 and greedy.dists == {}


def test_after_lead_leaves_the_draft_the_next_job_drafts_on_leads_path() -> None:
    # Lead's news can land while the model thread drafts on the old path; the old path's
    # tail, posted at lead's new length, would read as a draft continuing lead's tokens.
    mirror = LeadMirror()
    state = State(version=1, session_id="s", token_ids=[1, 2, 3], n_tokens=3, done=False,
                  draft_len=3)
    mirror.take(state)
    drafter = ModelDrafter(FakeModel(salt="draft", agree=0.8))
    drafted = extend(drafter, job(mirror.tokens, burst=4))
    assert drafted.grown == 4
    moved = [1, 2, 3, (drafted.local[3] + 1) % 80, 5]  # lead took another token at 3
    mirror.take(state.model_copy(update={"version": 2, "token_ids": moved, "n_tokens": 5}))
    assert mirror.draft_past(drafted.local) is None  # drafted past tokens lead did not take
    drafted = extend(drafter, job(mirror.tokens))  # catches up, drafts one
    assert drafted.local[:5] == tuple(moved) and drafted.grown == 1
    draft = mirror.draft_past(drafted.local)
    assert draft == list(drafted.local[5:])
    made = PostBook().next_post("s", 5, draft, "b")
    assert made is not None and (made[0].start, made[0].token_ids) == (5, draft)


class SignalledDraft(FakeModel):
    """A draft model that signals when an evaluation that may be aborted begins."""

    def __init__(self) -> None:
        super().__init__(salt="draft")
        self.evaluating = threading.Event()
        self.polls = 0  # of the abort check

    def _spend(self, n_tokens: int, abort: Callable[[], bool] | None, started: float) -> None:
        if abort is None:
            return super()._spend(n_tokens, None, started)
        self.evaluating.set()

        def counted() -> bool:
            self.polls += 1
            return abort()

        super()._spend(n_tokens, counted, started)


def test_news_that_parts_from_the_draft_stops_its_evaluation_midway() -> None:
    # Right after a rejection the back must evaluate lead's correction; finishing a guess
    # on the dead path first made the next draft miss lead's next step.
    draft = SignalledDraft()
    drafter = ModelDrafter(draft)
    latest = LeadMirror()
    latest.tokens = (1, 2, 3)
    assert extend(drafter, job([1, 2, 3], latest)).grown == 1
    guess = drafter.local[3]

    def extend_while_news_comes(lead: list[int], news: list[int], cost_s: float
                                ) -> tuple[int, int, int]:
        """(tokens drafted, cut short, abort checks after the news) while lead's news
        comes midway through a draft evaluation."""
        draft.cost_s = (cost_s, 0.0)
        draft.evaluating.clear()
        with ThreadPoolExecutor(1) as model_thread:
            running = model_thread.submit(extend, drafter, job(lead, latest))
            assert draft.evaluating.wait(10), "no draft evaluation began"
            latest.tokens = tuple(news)
            polls_at_news = draft.polls
            drafted = running.result(timeout=10)
            return drafted.grown, drafted.work.cut_short, draft.polls - polls_at_news

    # Lead took the guess: the draft goes on (its evaluation is needed for the next one).
    grown, cut_short, checks = extend_while_news_comes([1, 2, 3], [1, 2, 3, guess], 0.5)
    assert (grown, cut_short) == (1, 0) and checks > 0
    second = drafter.local[4]
    # Lead took another token than the second guess: that guess's evaluation is dropped
    # (finished, it would draft a third token).
    parted = [1, 2, 3, guess, (second + 1) % 80]
    assert extend_while_news_comes([1, 2, 3, guess], parted, 3.0)[:2] == (0, 1)
    assert draft.cached == [1, 2, 3, guess] and drafter.local[4] == second
    draft.cost_s = (0.0, 0.0)
    assert extend(drafter, job(parted, latest)).grown == 1
    assert drafter.local[:5] == parted


def test_the_abort_check_follows_each_snapshot_of_leads_tokens() -> None:
    latest = LeadMirror()
    latest.tokens = (1, 2)
    left = leaving(latest, (1, 2, 3, 4))
    assert not left()
    latest.tokens = (1, 2, 3)
    assert not left()  # lead took the draft's next token
    latest.tokens = (1, 2, 3, 9)
    assert left()
    latest.tokens = (1, 2, 3, 4, 5)  # (a later snapshot back on the path)
    assert not left()


def test_the_abort_check_compares_where_both_have_tokens() -> None:
    latest = LeadMirror()
    for path, tokens, left in [((1, 2, 3), (1, 2), False), ([1, 2], (1, 2, 3), False),
                               ((1, 2, 4), (1, 2, 3), True), ((), (1,), False)]:
        latest.tokens = tokens
        assert leaving(latest, path)() is left


def test_every_model_guess_carries_the_draft_models_probability_of_it() -> None:
    model = FakeModel(salt="draft")
    drafted = extend(ModelDrafter(model), job([1, 2, 3], burst=3))
    assert sorted(drafted.probs) == [3, 4, 5]
    for position, q in drafted.probs.items():
        row = model.logits_for(list(drafted.local[:position]))
        softmax = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
        assert drafted.local[position] == int(np.argmax(row))  # greedy: its top token
        assert q == pytest.approx(float(softmax.max()))
    assert extend(NgramDrafter(), job([1, 2, 3, 1, 2, 3], burst=2)).probs == {}


def test_a_job_for_a_post_ends_where_the_post_is_due_or_before_lead_s_step_ends() -> None:
    lead = (1, 2, 3)
    base = job(lead, burst=100, draft_len=7)  # as far ahead as 16

    def grown(**fields: object) -> int:
        return extend(ModelDrafter(FakeModel(salt="draft")), replace(base, **fields)).grown

    assert grown(stop_at=3) == 3
    assert grown(until=time.monotonic() - 1.0) == 1  # past due: one guess, then the post
    assert grown(until=time.monotonic() + 3600.0) == base.ahead  # no end near: all it may
    assert grown() == base.ahead


def test_sessions_drafted_together_stop_once_each_has_its_post() -> None:
    model = FakeModel(salt="draft", slots=2)
    work = [(i, ModelDrafter(model.slot(i)), replace(job([1, 2, 3 + i], burst=100,
                                                         draft_len=7), stop_at=stop))
            for i, stop in ((0, 2), (1, 4))]
    drafted = extend_many(model, work)
    assert [d.grown for d in drafted] == [4, 4]  # one call grows both: the later post rules

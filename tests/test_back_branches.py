"""Branches from the back: the draft model's branch sequences, the branches the drafter
grows beside its chain (one model call for all), adopting the one lead takes, the posts
that carry them, and the simulated draft's top-2 coverage."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import numpy as np
import pytest

from back.branching import Sprout
from back.drafter import ModelDrafter
from back.jobs import Drafted, DraftJob, ahead_for
from back.mirror import LeadMirror
from back.posts import PostBook
from back.worker import Worker
from bench.fake import ALPHABET, EOS, FakeModel
from shared.branch import Branch
from shared.model import MAIN, EvaluationAborted, common_prefix
from shared.sampling import Dist
from shared.wire.protocol import (
    MAX_BRANCH_TOKENS,
    MAX_BRANCHES,
    DraftPost,
    SamplingParams,
    SessionState,
    State,
    Update,
)
from tests.conftest import extend

GREEDY = SamplingParams()
HOT = SamplingParams(temperature=1.0)
PROMPT = [5, 12, 9, 30, 2, 17]


def draft_model(**kw: object) -> FakeModel:
    return FakeModel(salt="draft", agree=0.5, eos_bias=-100.0, **kw)  # type: ignore[arg-type]


def second(row: np.ndarray) -> int:
    return int(np.argsort(-row, kind="stable")[1])


# --- the fake draft model's branch sequences ---

def test_branches_fork_off_the_main_sequence_and_grow_in_one_call() -> None:
    model = draft_model(cost_s=(0.0, 0.0))
    model.evaluate(PROMPT + [3, 4, 8], 1)
    main = list(model.cached)
    model.fork(0, 4)
    model.fork(1, 7)
    calls = len(model.calls)
    rows = model.evaluate_many({MAIN: [9], 0: [40, 41], 1: [42]})
    assert len(model.calls) == calls + 1 and model.calls[-1] == 4  # one call, four tokens
    fresh = draft_model()
    assert np.array_equal(rows[0], fresh.logits_for(PROMPT[:4] + [40, 41]))
    assert np.array_equal(rows[1], fresh.logits_for(main[:7] + [42]))
    assert np.array_equal(rows[MAIN], fresh.logits_for(main + [9]))
    assert model.cached == main + [9]
    assert model.branch_cached[:2] == [PROMPT[:4] + [40, 41], main[:7] + [42]]
    model.adopt(0)  # the branch becomes the main sequence, the main one that slot
    assert model.cached == PROMPT[:4] + [40, 41] and model.branch_cached[0] == main + [9]
    with pytest.raises(ValueError):
        model.fork(0, len(model.cached) + 1)



def test_an_aborted_fake_evaluation_changes_no_sequence() -> None:
    # The fake computes its rows before it spends the call's time (so the call costs what
    # was asked): an abort while it spends must still leave every sequence as it was.
    model = draft_model(cost_s=(0.001, 0.0))
    model.evaluate(PROMPT, 1)
    model.fork(0, 3)
    before = (list(model.cached), [list(b) for b in model.branch_cached], model.evaluated)
    with pytest.raises(EvaluationAborted):
        model.evaluate_many({MAIN: [9], 0: [40]}, abort=lambda: True)
    with pytest.raises(EvaluationAborted):
        model.evaluate([9, 10], 1, abort=lambda: True)
    assert (model.cached, model.branch_cached, model.evaluated) == before
    rows = model.evaluate_many({MAIN: [9], 0: [40]})
    assert np.array_equal(rows[0], draft_model().logits_for(PROMPT[:3] + [40]))

# --- the simulated draft's top-2 model ---

def old_logits(model: FakeModel, context: list[int]) -> np.ndarray:
    """FakeModel's logits as they were before `cover` (tests compare exact outputs)."""
    key = tuple(context[-model.order:])
    digest = hashlib.blake2b(repr(("agree", key)).encode(), digest_size=8).digest()
    agrees = model.agree >= 1.0 or int.from_bytes(digest) / 2**64 < model.agree
    salt = model.agree_salt if agrees else model.salt
    seed = int.from_bytes(hashlib.blake2b(repr((salt, key)).encode(), digest_size=8).digest())
    logits = np.random.default_rng(seed).normal(0.0, 2.0, model.n_vocab).astype(np.float32)
    logits[EOS] += model.eos_bias
    logits[len(ALPHABET) + 1:] -= 100.0
    return logits


def contexts(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, len(ALPHABET) + 1, 3).tolist() for _ in range(n)]


def test_cover_zero_leaves_the_fake_models_logits_as_they_were() -> None:
    for model in (FakeModel(), FakeModel(salt="sim-draft", agree=0.8), draft_model()):
        for context in contexts(200):
            assert np.array_equal(model.logits_for(context), old_logits(model, context))


@pytest.mark.parametrize("cover", [0.0, 0.3, 0.7])
def test_cover_is_how_often_the_targets_token_is_the_drafts_second_choice(
        cover: float) -> None:
    target, draft = FakeModel(), FakeModel(salt="draft", agree=0.5, cover=cover)
    covered = disagreed = 0
    for context in contexts(4000, seed=1):
        wanted = int(np.argmax(target.logits_for(context)))
        row = draft.logits_for(context)
        if int(np.argmax(row)) != wanted:
            disagreed += 1
            covered += second(row) == wanted
    assert 1700 < disagreed < 2300  # agree=0.5 holds as before
    by_chance = 1 / 74  # a random row's second choice among the printable tokens
    expected = cover + (1 - cover) * by_chance
    assert abs(covered / disagreed - expected) < 0.04


# --- the drafter's branches ---

def job(sampling: SamplingParams = GREEDY, width: int = 0, depth: int = 3, burst: int = 1,
        ahead: int = 8, lead: tuple[int, ...] = tuple(PROMPT),
        latest: LeadMirror | None = None, seed: int = 0) -> DraftJob:
    if latest is None:
        latest = LeadMirror()
        latest.tokens = lead
    return DraftJob(lead, sampling, ahead, burst, frozenset({EOS}), np.random.default_rng(seed),
                    latest, width=width, depth=depth)


def grown(width: int, calls: int, sampling: SamplingParams = GREEDY, depth: int = 3,
          ahead: int = 8, model: FakeModel | None = None) -> tuple[ModelDrafter, Drafted]:
    """A drafter that made `calls` model calls past PROMPT with `width` branches."""
    drafter = ModelDrafter(model or draft_model())
    return drafter, extend(drafter, job(sampling, width, depth, calls, ahead))


def rejection_probs(local: tuple[int, ...]) -> dict[int, float]:
    """Position -> the chance, by the draft's own (greedy) probabilities, that lead reaches
    it and rejects the draft's guess there."""
    model, reach, p_reject = draft_model(), 1.0, {}
    for pos in range(len(PROMPT), len(local)):
        row = model.logits_for(local[:pos]).astype(np.float64)
        p = np.exp(row - row.max())
        prob = float(p[local[pos]] / p.sum())
        p_reject[pos], reach = reach * (1 - prob), reach * prob
    return p_reject


def test_greedy_branches_are_the_runner_up_then_the_drafts_own_continuation() -> None:
    chain = draft_model().greedy_continuation(PROMPT, 8)
    drafter, made = grown(width=3, calls=8)
    model = drafter.model
    assert isinstance(model, FakeModel)
    assert made.local == tuple(PROMPT + chain)  # the chain is what it is without branches
    # catching up (two calls), then one call per guess after the first (ready at once)
    assert len(model.calls) == 2 + 7
    assert len(made.branches) == 3
    p_reject = rejection_probs(made.local)
    assert sorted(b.branch.at for b in made.branches) == sorted(
        sorted(p_reject, key=lambda p: -p_reject[p])[:3])
    reference = draft_model()
    for b in (sprout.branch for sprout in made.branches):
        context = list(made.local[:b.at])
        assert b.token_ids[0] == second(reference.logits_for(context)) != made.local[b.at]
        rest = reference.greedy_continuation(context + [b.token_ids[0]], len(b.token_ids) - 1)
        assert list(b.token_ids[1:]) == rest and 1 < len(b.token_ids) <= 4  # up to depth 3
        assert b.dists is None  # picked greedily
    assert made.work.branch_grown == sum(len(b.branch.token_ids) - 1 for b in made.branches)


def test_every_call_carries_the_chain_and_each_branch() -> None:
    drafter, made = grown(width=2, calls=6, depth=8)
    model = drafter.model
    assert isinstance(model, FakeModel)
    sizes = model.calls[2:]  # after catching up: one batch per call
    assert len(sizes) == 5 and max(sizes) == 3  # the chain's guess and two branches
    assert sum(sizes) == 5 + made.work.branch_grown


def test_a_branchs_root_comes_from_the_same_adjusted_row_as_the_guess() -> None:
    _, plain = grown(width=1, calls=4)
    first = plain.branches[0]
    banned = SamplingParams(logit_bias={first.branch.token_ids[0]: -100.0})  # the runner-up there
    _, made = grown(width=8, calls=4, sampling=banned)
    at = next(b for b in made.branches if b.branch.at == first.branch.at)
    row = draft_model().logits_for(list(plain.local[:first.branch.at]))
    third = int(np.argsort(-row, kind="stable")[2])
    assert at.branch.token_ids[0] == third
    assert first.branch.token_ids[0] not in {b.branch.token_ids[0] for b in made.branches}


def test_sampled_branches_carry_the_distributions_they_were_drawn_from() -> None:
    _, made = grown(width=2, calls=6, sampling=HOT)
    assert len(made.branches) == 2
    for b in (sprout.branch for sprout in made.branches):
        root_dist = b.dists[0]
        assert isinstance(root_dist, Dist)
        # the root is the likeliest token other than the guess, in the row it was drawn from
        others = [int(t) for t in root_dist.token_ids if t != made.local[b.at]]
        assert b.token_ids[0] == others[0] and made.local[b.at] in root_dist.token_ids.tolist()
        for token, dist in zip(b.token_ids[1:], b.dists[1:], strict=True):
            assert isinstance(dist, Dist) and token in dist.token_ids.tolist()


def test_lead_taking_a_branch_makes_it_the_draft_with_nothing_evaluated_again() -> None:
    drafter, made = grown(width=4, calls=8, depth=4)
    model = drafter.model
    assert isinstance(model, FakeModel)
    taken = max((sprout.branch for sprout in made.branches), key=lambda b: len(b.token_ids))
    lead = tuple(made.local[:taken.at]) + taken.token_ids[:2]  # its root, and one guess
    evaluated = model.evaluated
    assert drafter.catch_up(lead) == 0 and model.evaluated == evaluated
    assert tuple(drafter.local) == tuple(made.local[:taken.at]) + taken.token_ids
    after = extend(drafter, job(lead=lead, burst=3, width=0, ahead=16))
    reference = draft_model().greedy_continuation(list(drafter.local[:len(lead)]), 40)
    assert list(after.local[len(lead):]) == reference[:len(after.local) - len(lead)]
    assert all(not b for b in model.branch_cached)  # the rest of the tree was dropped


def test_lead_leaving_chain_and_branches_drops_every_branch() -> None:
    drafter, made = grown(width=4, calls=8)
    model = drafter.model
    assert isinstance(model, FakeModel)
    n = len(PROMPT)
    roots = {b.branch.token_ids[0] for b in made.branches if b.branch.at == n}
    other = next(t for t in range(1, len(ALPHABET)) if t != made.local[n] and t not in roots)
    lead = tuple(PROMPT) + (other,)
    assert drafter.catch_up(lead) >= 1  # the new token is evaluated
    assert all(not b for b in model.branch_cached) and drafter.branches == ()
    again = extend(drafter, job(lead=lead, burst=1, width=2))
    assert again.local[:n + 1] == lead


def test_an_aborted_call_changes_nothing() -> None:
    drafter, made = grown(width=3, calls=5)
    latest = LeadMirror()
    latest.tokens = tuple(PROMPT) + (0,) * 30  # lead has left this path: abort at once
    again = extend(drafter, job(width=3, latest=latest))
    assert again.local == made.local and again.grown == 0 and again.work.branch_grown == 0
    assert again.work.cut_short == 1
    assert drafter.branches == made.branches


def test_branches_alone_grow_once_the_chain_is_as_far_ahead_as_it_goes() -> None:
    drafter, made = grown(width=2, calls=3, ahead=2, depth=6)
    assert len(made.local) == len(PROMPT) + 2 and made.grown == 2
    more = extend(drafter, job(width=2, depth=6, burst=4, ahead=2))
    assert more.grown == 0 and more.work.branch_grown > 0 and more.local == made.local
    deepest = max(len(b.branch.token_ids) for b in more.branches)
    assert deepest > max(len(b.branch.token_ids) for b in made.branches)


def test_a_branch_leaves_the_main_sequence_room_in_a_shared_context() -> None:
    """The branches' cells count against the context the main sequence needs: they end
    where it is full and are dropped when the main sequence grows into them."""
    model = draft_model(n_ctx=len(PROMPT) + 6)
    drafter = ModelDrafter(model)
    made = extend(drafter, job(width=2, depth=8, burst=12, ahead=3))
    cells = sum(len(b.branch.token_ids) - 1 for b in made.branches)
    assert made.branches and len(model.cached) + cells <= model.n_ctx
    more = extend(drafter, job(width=2, burst=6, ahead=6))  # no "context full"
    assert len(more.local) == len(PROMPT) + 6
    own = sum(len(b) - common_prefix(b, model.cached) for b in model.branch_cached)
    assert len(model.cached) + own <= model.n_ctx


def test_branches_keep_to_the_grammar() -> None:
    grammar = 'root ::= "abc" | "abd" | "axe" | "bee"'
    ruled = SamplingParams(grammar=grammar)
    model = draft_model()
    drafter = ModelDrafter(model)
    made = extend(drafter, DraftJob(tuple(PROMPT), ruled, 8, 12, frozenset({EOS}),
                                    np.random.default_rng(0), _latest(), n_prompt=len(PROMPT),
                                    width=8, depth=4))
    assert made.branches  # the grammar leaves a choice at the first tokens
    replies = {tuple(model.tokenize(word)) for word in ("abc", "abd", "axe", "bee")}
    for b in made.branches:
        path = tuple(made.local[len(PROMPT):b.branch.at]) + b.branch.token_ids
        assert path[-1] == EOS and path[:-1] in replies  # a whole reply the grammar allows


def _latest() -> LeadMirror:
    latest = LeadMirror()
    latest.tokens = tuple(PROMPT)
    return latest


# --- posts ---

def many_branches(depth: int) -> tuple[tuple[int, ...], list[Sprout]]:
    """A draft of 10 past PROMPT and a branch at each guess, `depth` tokens deep."""
    model = draft_model()
    local = tuple(PROMPT + model.greedy_continuation(PROMPT, 10))
    made = []
    for pos in range(len(PROMPT), len(local)):
        root = second(model.logits_for(list(local[:pos])))
        rest = model.greedy_continuation(list(local[:pos]) + [root], depth - 1)
        made.append(Sprout(local[:pos + 1], Branch(pos, (root, *rest))))
    return local, made


@pytest.mark.parametrize("depth", [4, 31])
def test_posts_carry_branches_within_the_protocols_bounds(depth: int) -> None:
    local, made = many_branches(depth)
    assert len(made) == MAX_BRANCHES + 2
    start, draft = len(PROMPT), list(local[len(PROMPT):])
    post, new = PostBook().next_post("s", start, draft, "b", with_dists=False,
                                     branches=made)  # type: ignore[misc]
    assert new == len(draft) and post.token_ids == draft
    DraftPost.model_validate(post.model_dump())  # lead's own check passes
    sizes = [len(b.token_ids) for b in post.branches]
    if depth == 4:  # as many as a post takes, whole
        assert sizes == [4] * MAX_BRANCHES
    else:  # as many tokens as a post takes, the first (likeliest) branches first
        assert sum(sizes) == MAX_BRANCH_TOKENS and sizes[0] == 31
    for b, mine in zip(post.branches, made, strict=False):
        ours = mine.branch
        assert b.at == ours.at - start and b.token_ids == list(ours.token_ids[:len(b.token_ids)])


def test_a_post_is_made_again_only_for_new_branches() -> None:
    local, made = many_branches(3)
    draft = list(local[len(PROMPT):])
    book = PostBook()
    assert book.next_post("s", len(PROMPT), draft, "b", with_dists=False) is not None
    assert book.next_post("s", len(PROMPT), draft, "b", with_dists=False) is None
    again = book.next_post("s", len(PROMPT), draft, "b", False, made[:2])
    assert again is not None and len(again[0].branches) == 2 and again[1] == 0
    assert book.next_post("s", len(PROMPT), draft, "b", False, made[:2]) is None
    # lead took the first token: the branch past it still hangs off what was posted
    assert book.next_post("s", len(PROMPT) + 1, draft[1:], "b", False, made[1:2]) is None


def test_branches_are_cut_to_the_longest_post_lead_takes() -> None:
    local, made = many_branches(4)
    post, _ = PostBook().next_post("s", len(PROMPT), list(local[len(PROMPT):]), "b", False,
                                   made[:2], longest=2)  # type: ignore[misc]
    assert [b.token_ids for b in post.branches] == [list(b.branch.token_ids[:2]) for b in made[:2]]


def test_sampled_posts_give_every_branch_token_a_distribution() -> None:
    _, made = grown(width=2, calls=6, sampling=HOT)
    start = len(PROMPT)
    book = PostBook()
    book.drafted(start, start, made.dists)
    post, _ = book.next_post("s", start, list(made.local[start:]), "b",  # type: ignore[misc]
                             branches=made.branches)
    assert post.dists is not None and len(post.branches) == 2
    for b in post.branches:
        assert b.dists is not None and len(b.dists) == len(b.token_ids)
    post, _ = PostBook().next_post("s", start, list(made.local[start:]), "b",  # type: ignore[misc]
                                   with_dists=False, branches=made.branches)
    assert post.dists is None and all(b.dists is None for b in post.branches)
    # as a branch drafted greedily in another session: no dists
    lacking = [replace(b, branch=replace(b.branch, token_ids=b.branch.token_ids[:2] + (EOS,),
                                         dists=None)) for b in made.branches]
    book = PostBook()
    book.drafted(start, start, made.dists)
    post, _ = book.next_post("s", start, list(made.local[start:]), "b",  # type: ignore[misc]
                             branches=lacking)
    assert post.dists is not None and post.branches == []  # no dists to give: not sent


# --- the worker ---

class RecordingLink:
    def __init__(self) -> None:
        self.posts = list[DraftPost]()
        self.news_s = 0.0

    async def post(self, post: DraftPost) -> None:
        self.posts.append(post)

    async def hello(self, hello: object) -> None:
        pass


def update_of(state: State) -> Update:
    return Update(version=state.version, lead_id=state.lead_id, sessions=[SessionState(
        session_id=state.session_id or "", token_ids=state.token_ids, n_tokens=state.n_tokens,
        done=state.done, draft_len=state.draft_len, sampling=state.sampling)])


def worker_posts(branches: int, draft_len: int = 2, model: FakeModel | None = None,
                 step_s: float | None = 1.0, step_before: float | None = None
                 ) -> list[DraftPost]:
    """What a worker posts while lead, holding PROMPT, verifies and sends no news; lead's
    step as the worker measured it is `step_s` (its draft calls cost next to nothing);
    with `step_before`, the step measured in a session that ended before this began, and
    none measured in this one."""
    state = State(version=1, lead_id="L", session_id="s", token_ids=PROMPT,
                  n_tokens=len(PROMPT), done=False, draft_len=draft_len)
    link = RecordingLink()
    drafter = ModelDrafter(model or draft_model())
    worker = Worker(None, drafter, None, None)  # type: ignore[arg-type]
    worker.batcher.branches = branches
    worker.batcher.attached(8, frozenset({EOS}))
    worker.lead_id, worker._link = "L", link  # type: ignore[assignment]
    if step_before is not None:
        worker._take(update_of(state.model_copy(update={"session_id": "earlier"})))
        worker.followers["earlier"].lead_step.step_s = step_before
        worker._end("earlier")
    worker._take(update_of(state))
    if step_before is None:
        worker.followers["s"].lead_step.step_s = step_s
    try:
        asyncio.run(asyncio.wait_for(worker._draft_ahead(), 20))  # until it has nothing new
    finally:
        worker.batcher.model_thread.shutdown()
    return link.posts


def test_a_worker_posts_branches_off_its_draft_where_they_fit_lead_s_step() -> None:
    chain = draft_model().greedy_continuation(PROMPT, ahead_for(2, 8))
    plain = worker_posts(branches=0)
    assert plain and all(not p.branches for p in plain)
    assert plain[-1].token_ids == chain  # as before: the chain alone
    posts = worker_posts(branches=2)
    for p in posts:  # branches grow beside the chain, whose tokens stay the same
        assert p.token_ids == chain[p.start - len(PROMPT):][:len(p.token_ids)]
    last = posts[-1]
    assert last.token_ids == chain and len(last.branches) == 2
    reference = draft_model()
    for b in last.branches:  # a draft (of 2) deep after the root
        context = PROMPT + chain[:b.at]
        assert b.token_ids[0] == second(reference.logits_for(context))
        assert b.token_ids[1:] == reference.greedy_continuation(context + b.token_ids[:1], 2)
    # not knowing lead's step yet, it drafts the chain alone
    assert all(not p.branches for p in worker_posts(branches=2, step_s=None))


def test_a_new_sessions_first_drafts_grow_branches_at_the_step_measured_before() -> None:
    # A reply's first drafts come while lead evaluates its prompt: no step of this session
    # is measured yet, but lead's step is what the session before measured.
    posts = worker_posts(branches=2, step_before=1.0)
    assert posts and len(posts[-1].branches) == 2


def test_a_worker_whose_model_cannot_fork_drafts_the_chain_alone() -> None:
    """--branches with a model that has no branch sequences: the chain, as without."""
    chain = draft_model().greedy_continuation(PROMPT, ahead_for(2, 8))
    unforking = draft_model()
    unforking.can_fork = False
    for single in (draft_model(n_branches=0), unforking):
        posts = worker_posts(branches=2, model=single)
        assert posts and all(not p.branches for p in posts)
        assert posts[-1].token_ids == chain


def test_the_branches_setting_reaches_the_worker() -> None:
    from back.__main__ import build_worker
    from back.settings import BackSettings

    worker = build_worker(BackSettings(drafter="ngram", branches=3))
    try:
        worker.lead_id = "L"
        worker._take(update_of(State(version=1, lead_id="L", session_id="s", token_ids=[1],
                                     n_tokens=1, done=False, draft_len=2)))
        assert worker.batcher.branches == 3
        assert worker.batcher.width(worker.followers["s"], 1) == 0  # n-grams do not branch
    finally:
        asyncio.run(worker.client.close())
    with pytest.raises(ValueError, match="branches"):
        BackSettings(branches=MAX_BRANCHES + 1)

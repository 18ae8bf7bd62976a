"""Branches from the back: the draft model's second sequence, the runner-ups the drafter
branches on, the posts that carry them, and the simulated draft's top-2 coverage."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace

import numpy as np
import pytest

from back.drafter import ModelDrafter
from back.jobs import BranchJob, DraftJob, LatestTokens, ahead_for, branch, extend
from back.posts import PostBook
from back.worker import Worker
from shared.fake import ALPHABET, EOS, FakeModel
from shared.protocol import MAX_BRANCH_TOKENS, MAX_BRANCHES, DraftPost, SamplingParams, State
from shared.sampling import Dist

GREEDY = SamplingParams()
HOT = SamplingParams(temperature=1.0)
PROMPT = [5, 12, 9, 30, 2, 17]


def draft_model(**kw: object) -> FakeModel:
    return FakeModel(salt="draft", agree=0.5, eos_bias=-100.0, **kw)  # type: ignore[arg-type]


def second(row: np.ndarray) -> int:
    return int(np.argsort(-row, kind="stable")[1])


# --- the fake draft model's second sequence ---

def test_a_fork_leaves_the_main_cache_and_gives_a_fresh_evaluations_logits() -> None:
    model = draft_model()
    model.evaluate(PROMPT + [3, 4, 8], 1)
    main = list(model.cached)
    model.fork(4)
    rows = model.evaluate_branch([40, 41, 42], 3)
    assert model.cached == main and model.branch_cached == PROMPT[:4] + [40, 41, 42]
    fresh = draft_model()
    assert np.array_equal(rows, fresh.evaluate(PROMPT[:4] + [40, 41, 42], 3))
    # the main sequence goes on where it was
    assert np.array_equal(model.evaluate([9], 1)[0], draft_model().logits_for(main + [9]))


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

def drafted(sampling: SamplingParams = GREEDY, draft_len: int = 3, seed: int = 0
            ) -> tuple[ModelDrafter, tuple[int, ...]]:
    """A drafter as far ahead of lead (PROMPT) as it drafts."""
    drafter = ModelDrafter(draft_model())
    latest = LatestTokens()
    latest.publish(tuple(PROMPT))
    rng = np.random.default_rng(seed)
    job = DraftJob(tuple(PROMPT), sampling, ahead_for(draft_len, 16), 100, frozenset({EOS}),
                   rng, latest)
    local = extend(drafter, job).local
    assert len(local) == len(PROMPT) + ahead_for(draft_len, 16)
    return drafter, local


def branch_job(width: int, depth: int, sampling: SamplingParams = GREEDY,
               latest: LatestTokens | None = None, seed: int = 1) -> BranchJob:
    if latest is None:
        latest = LatestTokens()
        latest.publish(tuple(PROMPT))
    return BranchJob(tuple(PROMPT), sampling, width, depth, frozenset({EOS}),
                     np.random.default_rng(seed), latest)


def rejection_odds(local: tuple[int, ...]) -> dict[int, float]:
    """Position -> the chance, by the draft's own (greedy) probabilities, that lead reaches
    it and rejects the draft's guess there."""
    model, reach, odds = draft_model(), 1.0, {}
    for pos in range(len(PROMPT), len(local)):
        row = model.logits_for(local[:pos]).astype(np.float64)
        p = np.exp(row - row.max())
        prob = float(p[local[pos]] / p.sum())
        odds[pos], reach = reach * (1 - prob), reach * prob
    return odds


def test_greedy_branches_are_the_runner_up_then_the_drafts_own_continuation() -> None:
    drafter, local = drafted()
    model = drafter.model
    assert isinstance(model, FakeModel)
    cached = list(model.cached)
    made = branch(drafter, branch_job(width=3, depth=3))
    assert made.local == local and len(made.branches) == 3
    odds = rejection_odds(local)
    assert [b.pos for b in made.branches] == sorted(odds, key=lambda p: -odds[p])[:3]
    reference = draft_model()
    for b in made.branches:
        context = list(local[:b.pos])
        assert b.tokens[0] == second(reference.logits_for(context)) != local[b.pos]
        assert list(b.tokens[1:]) == reference.greedy_continuation(context + [b.tokens[0]], 3)
        assert b.dists == (None,) * 4
    assert model.cached == cached  # the main draft stays cached
    # and drafting goes on from it: the next guess is evaluated, not the whole draft again
    before = model.evaluated
    latest = LatestTokens()
    latest.publish(tuple(PROMPT))
    job = DraftJob(tuple(PROMPT), GREEDY, ahead_for(3, 16) + 1, 1, frozenset({EOS}),
                   np.random.default_rng(0), latest)
    more = extend(drafter, job)
    assert more.local[:-1] == local and model.evaluated == before + 1
    assert more.local[-1] == reference.greedy_continuation(list(local), 1)[0]


def test_a_branchs_root_comes_from_the_same_adjusted_row_as_the_guess() -> None:
    plain_drafter, local = drafted()
    plain = branch(plain_drafter, branch_job(width=1, depth=2)).branches[0]
    banned = SamplingParams(logit_bias={plain.tokens[0]: -100.0})  # the runner-up there
    drafter = ModelDrafter(draft_model())
    latest = LatestTokens()
    latest.publish(tuple(PROMPT))
    extend(drafter, DraftJob(tuple(PROMPT), banned, ahead_for(3, 16), 100, frozenset({EOS}),
                             np.random.default_rng(0), latest))
    made = branch(drafter, branch_job(width=8, depth=2, sampling=banned)).branches
    at = next(b for b in made if b.pos == plain.pos)
    row = draft_model().logits_for(list(local[:plain.pos]))
    third = int(np.argsort(-row, kind="stable")[2])
    assert at.tokens[0] == third and plain.tokens[0] not in {b.tokens[0] for b in made}


def test_branches_asked_again_cost_nothing() -> None:
    drafter, _ = drafted()
    first = branch(drafter, branch_job(width=2, depth=3))
    evaluated = drafter.model.evaluated  # type: ignore[attr-defined]
    again = branch(drafter, branch_job(width=2, depth=3))
    assert again.branches == first.branches
    assert drafter.model.evaluated == evaluated  # type: ignore[attr-defined]


def test_sampled_branches_carry_the_distributions_they_were_drawn_from() -> None:
    drafter, local = drafted(HOT)
    made = branch(drafter, branch_job(width=2, depth=3, sampling=HOT))
    assert len(made.branches) == 2
    for b in made.branches:
        root_dist = b.dists[0]
        assert isinstance(root_dist, Dist)
        # the root is the likeliest token other than the guess, in the row the guess was
        # drawn from
        others = [int(t) for t in root_dist.token_ids if t != local[b.pos]]
        assert b.tokens[0] == others[0] and local[b.pos] in root_dist.token_ids.tolist()
        assert len(b.tokens) == 4
        for token, dist in zip(b.tokens[1:], b.dists[1:], strict=True):
            assert isinstance(dist, Dist) and token in dist.token_ids.tolist()


def test_lead_taking_a_step_stops_the_branching() -> None:
    drafter, local = drafted()
    latest = LatestTokens()
    latest.publish(tuple(PROMPT) + (local[len(PROMPT)],))  # lead's news: one more token
    assert branch(drafter, branch_job(width=2, depth=3, latest=latest)).branches == ()


# --- posts ---

@pytest.mark.parametrize("depth", [3, 30])
def test_posts_carry_branches_within_the_protocols_bounds(depth: int) -> None:
    drafter, local = drafted(draft_len=7)
    made = branch(drafter, branch_job(width=MAX_BRANCHES + 2, depth=depth)).branches
    assert len(made) == MAX_BRANCHES + 2
    start, draft = len(PROMPT), list(local[len(PROMPT):])
    post, new = PostBook().next_post("s", start, draft, "b",
                                     branches=made)  # type: ignore[misc]
    assert new == len(draft) and post.token_ids == draft
    DraftPost.model_validate(post.model_dump())  # lead's own check passes
    sizes = [len(b.token_ids) for b in post.branches]
    if depth == 3:  # as many as a post takes, whole
        assert sizes == [4] * MAX_BRANCHES
    else:  # as many tokens as a post takes, the likeliest branches first
        assert sum(sizes) == MAX_BRANCH_TOKENS and sizes[0] == 31
    for b, mine in zip(post.branches, made, strict=False):
        assert b.at == mine.pos - start and b.token_ids == list(mine.tokens[:len(b.token_ids)])


def test_a_post_is_made_again_only_for_new_branches() -> None:
    drafter, local = drafted()
    draft = list(local[len(PROMPT):])
    book = PostBook()
    assert book.next_post("s", len(PROMPT), draft, "b") is not None
    assert book.next_post("s", len(PROMPT), draft, "b") is None
    made = branch(drafter, branch_job(width=2, depth=3)).branches
    again = book.next_post("s", len(PROMPT), draft, "b", branches=made)
    assert again is not None and len(again[0].branches) == 2 and again[1] == 0
    assert book.next_post("s", len(PROMPT), draft, "b", branches=made) is None
    # lead took the first token: the branches past it still hang off what was posted
    assert book.next_post("s", len(PROMPT) + 1, draft[1:], "b",
                          branches=[b for b in made if b.pos > len(PROMPT)]) is None


def test_branches_are_cut_to_the_longest_post_lead_takes() -> None:
    drafter, local = drafted()
    made = branch(drafter, branch_job(width=2, depth=3)).branches
    post, _ = PostBook().next_post("s", len(PROMPT), list(local[len(PROMPT):]), "b",
                                   branches=made, longest=2)  # type: ignore[misc]
    assert [b.token_ids for b in post.branches] == [list(b.tokens[:2]) for b in made]


def test_sampled_posts_give_every_branch_token_a_distribution() -> None:
    drafter, local = drafted(HOT)
    book = PostBook()
    start = len(PROMPT)
    latest = LatestTokens()
    latest.publish(tuple(PROMPT))
    # the drafter's distributions, as the worker hands them to the post book
    fresh = ModelDrafter(draft_model())
    got = extend(fresh, DraftJob(tuple(PROMPT), HOT, ahead_for(3, 16), 100, frozenset({EOS}),
                                 np.random.default_rng(0), latest))
    assert got.local == local
    book.drafted(start, start, got.dists)
    made = branch(drafter, branch_job(width=2, depth=3, sampling=HOT)).branches
    post, _ = book.next_post("s", start, list(local[start:]), "b",
                             branches=made)  # type: ignore[misc]
    assert post.dists is not None and len(post.branches) == 2
    for b in post.branches:
        assert b.dists is not None and len(b.dists) == len(b.token_ids)
    post, _ = PostBook().next_post("s", start, list(local[start:]), "b",  # type: ignore[misc]
                                   with_dists=False, branches=made)
    assert post.dists is None and all(b.dists is None for b in post.branches)
    lacking = [replace(b, tokens=b.tokens[:2] + (EOS,), dists=(*b.dists[:2], None))
               for b in made]  # (as a branch drafted greedily in another session)
    book = PostBook()
    book.drafted(start, start, got.dists)
    post, _ = book.next_post("s", start, list(local[start:]), "b",  # type: ignore[misc]
                             branches=lacking)
    assert post.dists is not None and post.branches == []  # no dists to give: not sent


# --- the worker ---

class RecordingLead:
    def __init__(self, state: State) -> None:
        self.reply, self.posts = state, list[DraftPost]()

    async def post_draft(self, post: DraftPost) -> State:
        self.posts.append(post)
        return self.reply


def worker_posts(branches: int, draft_len: int = 2, model: FakeModel | None = None
                 ) -> list[DraftPost]:
    """What a worker posts while lead, holding PROMPT, verifies and sends no news."""
    state = State(version=1, lead_id="L", session_id="s", token_ids=PROMPT,
                  n_tokens=len(PROMPT), done=False, draft_len=draft_len)
    lead = RecordingLead(state)
    drafter = ModelDrafter(model or draft_model())
    worker = Worker(lead, drafter, None, None)  # type: ignore[arg-type]
    worker.branches, worker.max_post = branches, 8
    worker.eos_token_ids = frozenset({EOS})
    worker.mirror.attach("L")
    worker._settle(state)
    try:
        asyncio.run(asyncio.wait_for(worker._draft_ahead(), 20))  # until it has nothing new
    finally:
        worker.model_thread.shutdown()
    return lead.posts


def test_a_worker_as_far_ahead_as_it_drafts_posts_branches_off_its_draft() -> None:
    chain = draft_model().greedy_continuation(PROMPT, ahead_for(2, 8))
    plain = worker_posts(branches=0)
    assert plain and all(not p.branches for p in plain)
    assert plain[-1].token_ids == chain  # as before: the chain alone
    posts = worker_posts(branches=2)
    for p in posts:  # branching interleaves with the chain, whose tokens stay the same
        assert p.token_ids == chain[p.start - len(PROMPT):][:len(p.token_ids)]
    last = posts[-1]
    assert last.token_ids == chain and len(last.branches) == 2
    reference = draft_model()
    for b in last.branches:  # half a draft (of 2) deep
        context = PROMPT + chain[:b.at]
        assert b.token_ids[0] == second(reference.logits_for(context))
        assert b.token_ids[1:] == reference.greedy_continuation(context + b.token_ids[:1], 1)


def test_a_worker_whose_model_cannot_fork_drafts_the_chain_alone() -> None:
    """--branches with a model that has one sequence: the chain, posted as without."""
    single = draft_model()
    single.can_fork = False
    chain = draft_model().greedy_continuation(PROMPT, ahead_for(2, 8))
    posts = worker_posts(branches=2, model=single)  # (it used to spin, never posting)
    assert posts and all(not p.branches for p in posts)
    assert posts[-1].token_ids == chain


def test_a_branch_leaves_the_main_sequence_room_in_a_shared_context() -> None:
    """The branch's own cells count against the context the main sequence needs: they
    are dropped when the main sequence grows into them, and a branch stops short."""
    model = draft_model(n_ctx=len(PROMPT) + 6)
    drafter, latest = ModelDrafter(model), LatestTokens()
    latest.publish(tuple(PROMPT))
    extend(drafter, DraftJob(tuple(PROMPT), GREEDY, 3, 100, frozenset({EOS}),
                             np.random.default_rng(0), latest))
    made = branch(drafter, BranchJob(tuple(PROMPT), GREEDY, 1, 8, frozenset({EOS}),
                                     np.random.default_rng(1), latest)).branches
    assert made and len(model.cached) + len(made[0].tokens) <= model.n_ctx
    more = extend(drafter, DraftJob(tuple(PROMPT), GREEDY, 6, 100, frozenset({EOS}),
                                    np.random.default_rng(0), latest))  # no "context full"
    assert len(more.local) == len(PROMPT) + 6 and model.branch_cached == []


def test_the_branches_setting_reaches_the_worker() -> None:
    from back.__main__ import build_worker
    from back.settings import BackSettings

    assert BackSettings().branches == 0  # off until it pays (docs/benchmarks.md)
    worker = build_worker(BackSettings(drafter="ngram", branches=0))
    try:
        assert worker.branches == 0
    finally:
        asyncio.run(worker.client.close())
    with pytest.raises(ValueError, match="branches"):
        BackSettings(branches=MAX_BRANCHES + 1)


def test_branches_keep_to_the_grammar() -> None:
    grammar = 'root ::= "abc" | "abd" | "axe" | "bee"'
    ruled = SamplingParams(grammar=grammar)
    model = draft_model()
    latest = LatestTokens()
    latest.publish(tuple(PROMPT))
    drafter = ModelDrafter(model)
    extend(drafter, DraftJob(tuple(PROMPT), ruled, ahead_for(3, 16), 100, frozenset({EOS}),
                             np.random.default_rng(0), latest, n_prompt=len(PROMPT)))
    job = BranchJob(tuple(PROMPT), ruled, 8, 3, frozenset({EOS}), np.random.default_rng(1),
                    latest, n_prompt=len(PROMPT))
    made = branch(drafter, job)
    assert made.branches  # the grammar leaves a choice at the first tokens
    replies = {tuple(model.tokenize(word)) for word in ("abc", "abd", "axe", "bee")}
    for b in made.branches:
        path = tuple(made.local[len(PROMPT):b.pos]) + b.tokens
        assert path[-1] == EOS and path[:-1] in replies  # a whole reply the grammar allows

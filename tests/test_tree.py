"""Tree-verified steps: lead verifies a back's branches beside its draft in one batch.

The verifier goes on along a branch only where the token it emits in place of a rejected
draft token is that branch's root; the batch is priced, and the tree only verified where
it pays; a model call evaluates the tree and keeps the path taken. Greedy output never
changes (scripted and hypothesis trees); sampling stays exact (tests/test_sampling_exact.py
has the chi-square test of a tree-verified step).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lead.backs.feed import BackFeed, attach
from lead.decode.engine import Engine, GenRequest, Session
from lead.decode.session import StepResult
from lead.decode.verify import Verdict, verify_tree
from lead.drafts.board import DraftBoard, post_candidates
from lead.policy.branchcost import branch_lengths
from lead.policy.cost import CostModel
from shared.branch import Branch
from shared.fake import FakeModel, VirtualClock
from shared.model import MAIN
from shared.protocol import SamplingParams
from tests.test_branches import random_tree, with_tree_back
from tests.test_inprocess import reference, run

GREEDY = SamplingParams()


def rows_along(target: FakeModel, context: list[int], ids: list[int]) -> np.ndarray:
    """The target's rows after context + ids[:i], for i in 0..len(ids)."""
    return np.stack([target.logits_for(context + ids[:i]) for i in range(len(ids) + 1)])


def tree_branch(target: FakeModel, context: list[int], main: list[int], b: Branch
                ) -> tuple[Branch, np.ndarray]:
    prefix = context + main[:b.at]
    ids = list(b.token_ids)
    rows = np.stack([target.logits_for(prefix + ids[:i + 1]) for i in range(len(ids))])
    return b, rows


# --- the verifier ---


def test_a_rejection_whose_correction_is_a_branchs_root_goes_on_along_that_branch() -> None:
    target, context = FakeModel(eos_bias=-100.0), [1, 2, 3]
    truth = target.greedy_continuation(context, 8)
    main = [truth[0], truth[1] % 90 + 1, truth[2]]  # wrong at 1
    decoy = Branch(1, (truth[1] % 90 + 2, *truth[2:4]))  # a root lead does not emit
    right = Branch(1, (truth[1], *truth[2:5], truth[5] % 90 + 1))  # wrong at its last token
    verdict = verify_tree(main, rows_along(target, context, main),
                          [tree_branch(target, context, main, b) for b in (decoy, right)],
                          GREEDY, np.random.default_rng(0), context=context)
    assert verdict.branch == 1
    assert verdict.accepted == truth[:5] and verdict.next_token == truth[5]
    assert verdict.rows is not None  # row i emitted emitted[i] (logprobs read them)
    assert [int(np.argmax(r)) for r in verdict.rows[:len(verdict.emitted)]] == verdict.emitted


def test_a_branch_is_not_taken_where_the_draft_was_accepted_or_its_root_not_emitted() -> None:
    target, context = FakeModel(eos_bias=-100.0), [4, 5, 6]
    truth = target.greedy_continuation(context, 6)
    main = [truth[0], truth[1], truth[2] % 90 + 1]
    off_path = [Branch(0, (truth[0] % 90 + 1, 7)),  # at an accepted position
                Branch(2, (truth[2] % 90 + 2, 7))]  # the wrong root where main is rejected
    verdict = verify_tree(main, rows_along(target, context, main),
                          [tree_branch(target, context, main, b) for b in off_path],
                          GREEDY, np.random.default_rng(0), context=context)
    assert verdict.branch is None and verdict.emitted == truth[:3]


def speculate_trees(target: FakeModel, prompt: list[int], n: int, seed: int) -> list[int]:
    """Lead's steps with every step a tree: the best draft on the board and its forks,
    verified in one go, as the decoder does."""
    board, out, rng = DraftBoard(), [], np.random.default_rng(seed)
    while len(out) < n and 0 not in out:
        context = prompt + out
        start, main, branches = random_tree(target, context, rng)
        main_c, *rest = post_candidates("b", start, main, None, branches)
        board.post(context, main_c, rest)
        draft = board.best(context, 6)
        ids = draft.token_ids if draft else []
        tree = [tree_branch(target, context, ids, b) for b in draft.branches] if draft else []
        verdict = verify_tree(ids, rows_along(target, context, ids), tree, GREEDY, rng,
                              context=context)
        at = len(verdict.accepted) if verdict.branch is None else tree[verdict.branch][0].at
        if at < len(ids):  # a rejected draft token is never emitted in its place
            assert verdict.emitted[at] != ids[at]
        out += verdict.emitted
    return out[: out.index(0) + 1 if 0 in out else n]


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_trees_verified_whole_never_change_greedy_output(seed: int) -> None:
    target = FakeModel()
    assert speculate_trees(target, [1, 2, 3], 40, seed) == target.greedy_continuation([1, 2, 3],
                                                                                        40)


def test_the_board_offers_a_posts_forks_beside_its_draft() -> None:
    board, tokens = DraftBoard(), [1, 2, 3, 4]
    main, *rest = post_candidates("b", 3, [4, 5, 6, 7], None,
                                  [Branch(0, (9,)), Branch(2, (8, 9)), Branch(3, (10, 11))])
    assert board.post(tokens, main, rest)
    draft = board.best(tokens, 3)  # the draft from lead's next token: 5, 6, 7, cut to 3
    assert draft is not None and draft.token_ids == [5, 6, 7]
    # the fork at 0 is behind lead already; the others count from the draft's first token
    assert [(b.at, b.token_ids) for b in draft.branches] == [(1, (8, 9)), (2, (10, 11))]
    assert [b.at for b in board.best(tokens, 2).branches] == [1]  # within the draft's limit


# --- the price of a tree ---


def test_branches_pay_where_a_wider_batch_is_nearly_free_and_not_where_it_costs_its_width() -> None:
    offered = [(0, 5), (1, 5), (2, 5)]

    def flat(b: int) -> float:
        return 0.03 + 0.0005 * b

    def linear(b: int) -> float:
        return 0.03 * b

    chosen = branch_lengths(4, offered, 0.7, 0.7, 3.0, flat, 17)
    assert chosen[0] >= 2 and sum(chosen) + 5 <= 17
    assert branch_lengths(4, offered, 0.7, 0.7, 3.0, linear, 17) == [0, 0, 0]
    assert branch_lengths(4, offered, 0.7, 0.0, 3.0, flat, 17) == [0, 0, 0]  # never covered
    assert branch_lengths(4, offered, 0.7, 0.7, 3.0, flat, 5) == [0, 0, 0]  # no room
    assert branch_lengths(1, offered, 0.7, 0.7, 3.0, flat, 17)[1:] == [0, 0]  # past the draft


def test_only_the_first_branch_at_a_position_is_priced_and_the_width_is_bounded() -> None:
    cost = CostModel(max_draft=8, tree_width=1)
    cost.prices.calibrate({b: 0.03 + 0.0001 * b for b in range(1, 18)})
    assert branch_lengths(4, [(0, 4), (0, 4)], 0.7, 0.7, 3.0, cost.prices.busy_s, 17)[1] == 0
    lengths = cost.branches(4, [(0, 4), (1, 4)], 17)
    assert sum(1 for n in lengths if n) == 1
    cost.fixed = 4  # a forced draft length verifies chains
    assert cost.branches(4, [(0, 4), (1, 4)], 17) == [0, 0]


def test_cover_learns_how_often_a_root_held_the_correction() -> None:
    cover = CostModel(max_draft=8).cover
    assert cover.value == 0.5
    for _ in range(20):
        cover.record(True, False)
    assert cover.value > 0.9
    for _ in range(20):
        cover.record(False, True)
    assert cover.value < 0.2


# --- the model call ---


def test_the_fake_evaluates_a_tree_as_separate_sequences_would() -> None:
    model, context = FakeModel(), [1, 2, 3, 4]
    model.evaluate(context[:-1], 0)
    main_rows, branch_rows = model.evaluate_tree([4, 10, 11, 12], [(0, [20, 21]), (2, [30])])
    assert np.array_equal(main_rows, rows_along(model, context, [10, 11, 12]))
    assert np.array_equal(branch_rows[0], np.stack([model.logits_for(context + [20]),
                                                    model.logits_for(context + [20, 21])]))
    assert np.array_equal(branch_rows[1][0], model.logits_for(context + [10, 11, 30]))
    assert model.cached == context + [10, 11, 12]
    assert model.branch_cached[1] == context + [10, 11, 30]
    with pytest.raises(ValueError):
        model.evaluate_tree([5, 6], [(1, [7])])  # a branch must fork before the last token
    with pytest.raises(ValueError):
        model.evaluate_tree([5, 6], [(0, [])])
    assert model.evaluate_many({MAIN: [9]})[MAIN].shape == (model.n_vocab,)


# --- the engine: trees verified where they pay, and the path kept ---


async def _reply(engine: Engine, prompt: list[int], n: int, poster) -> list[int]:  # type: ignore[no-untyped-def]
    async for _ in engine.generate(GenRequest(prompt_ids=list(prompt), max_tokens=n)):
        s = engine.session
        if s is not None and not s.done:
            poster(engine, s)
    assert engine.session is not None
    return engine.session.tokens[len(prompt):]


def priced_engine(tree: int) -> Engine:
    clock = VirtualClock()  # prices exact however loaded this machine is
    target = FakeModel(eos_bias=-100.0, cost_s=(0.003, 0.00005), clock=clock)
    engine = Engine(target, max_draft=4, clock=clock, tree=tree)
    engine.calibrate(passes=1)
    attach(engine)  # (its back posts through the feed: feed_of)
    return engine


def feed_of(engine: Engine) -> BackFeed:
    return next(f for f in engine.events.listeners if isinstance(f, BackFeed))


def wrong_at_1_with_its_branch(truth: list[int]):  # type: ignore[no-untyped-def]
    """A back whose draft is wrong at its second token every time, and whose branch there
    holds the target's token and what follows."""
    def poster(engine: Engine, s: Session) -> None:
        n = s.n_generated
        if n + 7 <= len(truth):
            main = [truth[n], truth[n + 1] % 90 + 1, *truth[n + 2:n + 4]]
            feed_of(engine).post_draft(s.id, len(s.tokens), main, None, "b",
                                       [Branch(1, tuple(truth[n + 1:n + 6]))])
    return poster


def test_the_engine_verifies_trees_that_pay_and_keeps_the_path_it_took() -> None:
    prompt = [1, 2, 3]
    truth = FakeModel(eos_bias=-100.0).greedy_continuation(prompt, 60)
    engine = priced_engine(tree=4)
    assert asyncio.run(_reply(engine, prompt, 60, wrong_at_1_with_its_branch(truth))) == truth
    m, model = engine.metrics, engine.model
    assert m.tree_steps >= 3 and m.tree_taken >= 3 and m.tree_branches >= m.tree_steps
    assert engine.cost.cover.value > 0.5  # every rejection's correction was a root
    # a root is lead's own draw where it rejected the draft's guess: counted so, never as
    # an accepted guess (acceptance, and the chat's highlighting, stay those of chains)
    assert m.rejections >= m.tree_taken and m.accepted <= m.drafted - m.tree_taken
    assert all(not b for b in model.branch_cached)  # no branch cells left behind
    assert model.cached == prompt + truth[:-1]  # the cache holds the path taken
    # without trees the same back's branch is only the next step's draft
    chains = priced_engine(tree=0)
    assert asyncio.run(_reply(chains, prompt, 60, wrong_at_1_with_its_branch(truth))) == truth
    assert chains.metrics.tree_steps == 0 and chains.metrics.steps > m.steps


def test_a_back_over_http_gets_its_trees_verified_whole_and_changes_no_output() -> None:
    async def body() -> None:
        alone = await reference()
        # a token more costs under 2 % of a step: trees pay
        text, counters, target = await with_tree_back(cost_s=(0.003, 0.00005))
        assert text == alone
        assert counters["duo_tree_branches_taken_total"] >= 1, counters
        assert counters["duo_branch_cover"] > 0.5, counters
        assert not any(target.branch_cached)
    run(body())


def test_a_taken_branchs_root_is_no_accepted_guess() -> None:
    verdict = Verdict([5, 6, 7, 8], 9, branch=0)  # the draft's 5, then root 6 and 7, 8
    result = StepResult(verdict, 8, 0.1, "b", path=4, tree=1, root_at=1)
    assert [result.from_draft(i) for i in range(5)] == [True, False, True, True, False]
    assert result.rejections == 1 and not result.rejected  # the draft's guess at 1

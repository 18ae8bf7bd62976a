"""Branches: a back's alternatives off its main chain, kept by lead and used after a rejection.

The board (a branch is the draft at once after lead rejects the main chain at its root),
greedy exactness with random trees, junk trees through the API, and the counters.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import httpx
import numpy as np
from fastapi.testclient import TestClient
from httpx_ws import AsyncWebSocketSession, aconnect_ws
from httpx_ws.transport import ASGIWebSocketTransport
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.fake import FakeModel
from lead.backs.feed import attach
from lead.decode.engine import Engine, GenRequest, Session
from lead.decode.verify import verify
from lead.drafts.board import Candidate, DraftBoard, post_candidates
from lead.server.app import create_app
from lead.server.prometheus import exposition
from shared.branch import Branch
from shared.sampling import Dist
from shared.wire.protocol import MAX_BRANCHES, SamplingParams
from shared.wire.scrape import read_samples
from tests.conftest import chat_body, make_settings
from tests.test_inprocess import TARGET_COST, ask, new_lead, reference, run, text_of
from tests.test_link import link_post

GREEDY = SamplingParams()


def post(board: DraftBoard, tokens: list[int], back_id: str, start: int, main: list[int],
         *branches: tuple[int, list[int]]) -> bool:
    main_c, *rest = post_candidates(back_id, start, main, None,
                                    [Branch(at, tuple(ids)) for at, ids in branches])
    return board.post(tokens, main_c, rest)


# --- the board ---


def test_a_branch_is_the_draft_at_once_after_the_main_chain_is_rejected_at_its_root() -> None:
    board = DraftBoard()
    tokens = [1, 2]
    assert post(board, tokens, "b", 2, [3, 4, 5, 6], (1, [7, 8, 9]), (1, [6, 5]))
    draft = board.best(tokens, 8)
    assert draft is not None and draft.token_ids == [3, 4, 5, 6] and not draft.branch
    tokens += [3, 7]  # lead accepted 3, rejected 4 and emitted 7 in its place
    draft = board.best(tokens, 8)
    assert draft is not None and draft.token_ids == [8, 9] and draft.branch
    assert draft.back_id == "b"
    assert len(board.candidates["b"]) == 1  # the main chain and the other branch are gone


def test_a_branch_is_not_offered_before_lead_emits_its_root() -> None:
    # Its root is chosen, not sampled: verified as a draft token it would bias sampling,
    # so a branch reaching further than its main chain still waits for lead's own token.
    board = DraftBoard()
    tokens = [1]
    post(board, tokens, "b", 1, [2, 3], (0, [4, 5, 6, 7, 8]))
    draft = board.best(tokens, 8)
    assert draft is not None and draft.token_ids == [2, 3] and not draft.branch
    draft = board.best([1, 4], 8)
    assert draft is not None and draft.token_ids == [5, 6, 7, 8] and draft.branch


def test_branch_dists_follow_the_main_chains_up_to_the_root() -> None:
    dist = [Dist(np.array([t]), np.array([1.0])) for t in range(6)]
    main, branch = post_candidates("b", 4, [1, 2, 3], dist[:3],
                                   [Branch(1, (4, 5), (dist[4], dist[5]))])
    assert main.dists == tuple(dist[:3]) and main.root is None
    assert branch == Candidate("b", 4, (1, 4, 5), (dist[0], dist[4], dist[5]), root=1)
    board = DraftBoard()
    board.post([0, 0, 0, 0], main, [branch])
    draft = board.best([0, 0, 0, 0, 1, 4], 8)
    assert draft is not None and draft.token_ids == [5] and draft.dists == [dist[5]]


def test_a_post_replaces_all_of_the_backs_candidates() -> None:
    board = DraftBoard()
    tokens = [1, 2]
    post(board, tokens, "b", 2, [3, 4, 5], (0, [7, 8]), (1, [9, 9]))
    post(board, tokens, "b", 2, [3, 4, 6])  # its next post has no branches
    assert [c.token_ids for c in board.candidates["b"]] == [(3, 4, 6)]
    assert board.best([1, 2, 7], 8) is None  # the old branch at 0 went with the old post
    post(board, [1, 2], "b", 2, [3], (0, [5, 1]))
    post(board, [1, 2], "other", 2, [3, 3, 3])  # another back's post leaves b's alone
    assert len(board.candidates["b"]) == 2


def test_stale_branches_are_dropped() -> None:
    board = DraftBoard()
    tokens = [1, 2]
    post(board, tokens, "b", 2, [3, 4, 5, 6], (0, [7, 8]), (2, [9, 9, 9]))
    draft = board.best([1, 2, 3, 4, 5], 8)  # lead accepted the main chain past both roots
    assert draft is not None and draft.token_ids == [6] and not draft.branch
    assert [c.root for c in board.candidates["b"]] == [None]
    assert board.best([1, 2, 3, 4, 5, 1], 8) is None  # and then went another way
    assert board.candidates == {}


def test_a_post_whose_main_chain_is_stale_keeps_a_branch_that_agrees() -> None:
    # The post was in flight while lead rejected at position 3 and emitted 7 there.
    board = DraftBoard()
    tokens = [1, 2, 3, 7]
    assert post(board, tokens, "b", 2, [3, 4, 5], (1, [7, 8]))
    assert board.best(tokens, 8).token_ids == [8]
    assert not post(board, tokens, "b", 2, [3, 4, 5], (1, [6, 8]))  # nothing can be verified
    assert board.stale == 1


def test_ties_go_to_a_main_chain() -> None:
    board = DraftBoard()
    tokens = [1, 2]
    post(board, tokens, "b", 2, [3, 4, 5], (0, [7, 8, 9]))  # b's branch: posted first
    tokens.append(7)
    post(board, tokens, "a", 3, [8, 5])  # a's main chain ends where b's branch does
    draft = board.best(tokens, 8)
    assert draft is not None and draft.back_id == "a" and draft.token_ids == [8, 5]
    post(board, tokens, "a", 3, [8])  # shorter: the branch reaches further
    assert board.best(tokens, 8).token_ids == [8, 9]


# --- greedy: no tree changes the output ---


Poster = Callable[[DraftBoard, list[int]], None]


def speculate(target: FakeModel, prompt: list[int], n: int, poster: Poster, limit: int = 4
              ) -> tuple[list[int], int]:
    """Lead's steps over the board: a post when `poster` makes one, then the best draft
    verified. Returns what was emitted and how many steps verified a branch."""
    board, out, from_branch = DraftBoard(), [], 0
    rng = np.random.default_rng(0)
    while len(out) < n and 0 not in out:
        context = prompt + out
        poster(board, context)
        draft = board.best(context, limit)
        ids = draft.token_ids if draft else []
        from_branch += bool(draft and draft.branch)
        rows = np.stack([target.logits_for(context + ids[:i]) for i in range(len(ids) + 1)])
        verdict = verify(ids, rows, GREEDY, rng)
        assert verdict.accepted == ids[: len(verdict.accepted)], "accepted must be a prefix"
        if len(verdict.accepted) < len(ids):  # the rejected token is never emitted
            assert verdict.next_token != ids[len(verdict.accepted)]
        out += verdict.emitted
    return out[: out.index(0) + 1 if 0 in out else n], from_branch


def random_tree(target: FakeModel, context: list[int], rng: np.random.Generator
                ) -> tuple[int, list[int], list[Branch]]:
    """A post off `context` (started up to 2 tokens back): a main chain that is mostly
    right, and branches rooted at the truth where it is wrong, or at junk lead may never
    emit (also where it is right, and before lead's last token), continuations mostly right."""
    start = len(context) - int(rng.integers(0, min(3, len(context))))
    known = context[start:]
    main = known + noisy(target.greedy_continuation(context, int(rng.integers(1, 11))), rng)
    branches = []
    for at in range(len(main)):
        prefix = context[:start] + main[:at]
        right = target.greedy_continuation(prefix, 1)[0]
        root = right if rng.random() < 0.7 else int(rng.integers(1, target.n_vocab))
        if root == main[at] or rng.random() < 0.3 or len(branches) == MAX_BRANCHES:
            continue
        rest = noisy(target.greedy_continuation(prefix + [root], int(rng.integers(0, 6))), rng)
        branches.append(Branch(at, (root, *rest)))
    return start, main, branches


def noisy(ids: list[int], rng: np.random.Generator) -> list[int]:
    flip = rng.random(len(ids)) < 0.25
    return [int(rng.integers(1, 96)) if f else t for t, f in zip(ids, flip, strict=True)]


def tree_poster(target: FakeModel, seed: int, schedule: list[bool]) -> Poster:
    rng = np.random.default_rng(seed)
    posts = iter(schedule * 20)

    def poster(board: DraftBoard, context: list[int]) -> None:
        if next(posts, False):  # not every step: a branch must serve without a new post
            start, main, branches = random_tree(target, context, rng)
            main_c, *rest = post_candidates("b", start, main, None, branches)
            board.post(context, main_c, rest)
    return poster


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), schedule=st.lists(st.booleans(), min_size=1,
                                                         max_size=12))
def test_random_trees_never_change_greedy_output(seed: int, schedule: list[bool]) -> None:
    target = FakeModel()
    prompt = [1, 2, 3]
    alone = target.greedy_continuation(prompt, 40)
    out, _ = speculate(target, prompt, 40, tree_poster(target, seed, schedule))
    assert out == alone


def test_random_trees_do_get_verified_from_branches() -> None:
    # The property above holds for many trees only if branches are really verified.
    target = FakeModel()
    alone = target.greedy_continuation([1, 2, 3], 40)
    used = 0
    for seed in range(20):
        out, from_branch = speculate(target, [1, 2, 3], 40, tree_poster(target, seed,
                                                                         [True, False]))
        assert out == alone
        used += from_branch
    assert used >= 10


# --- the counters: a step after a rejection finds its branch ready ---


async def _reply(engine: Engine, prompt: list[int], n: int,
                 tree: Callable[[Engine, Session], None] | None = None) -> list[int]:
    async for _ in engine.generate(GenRequest(prompt_ids=list(prompt), max_tokens=n)):
        s = engine.session
        if tree is not None and s is not None and not s.done:
            tree(engine, s)
    assert engine.session is not None
    return engine.session.tokens[len(prompt):]


def test_ready_after_rejection_counts_a_matching_branch() -> None:
    prompt = [1, 2, 3]
    truth = asyncio.run(_reply(Engine(FakeModel(eos_bias=-100.0)), prompt, 30))
    engine = Engine(FakeModel(eos_bias=-100.0), max_draft=4, draft_len=4)
    feed = attach(engine)
    wrong = truth[3] % 90 + 1

    def tree(engine: Engine, s: Session) -> None:
        if s.n_generated == 1:  # once, after the first token: the next step verifies it
            feed.post_draft(s.id, 4, [truth[1], truth[2], wrong, truth[4]], None, "b",
                            [Branch(2, tuple(truth[3:8]))])

    assert asyncio.run(_reply(engine, prompt, 30, tree)) == truth
    m = engine.metrics
    # step 2 verified the main chain and rejected `wrong`; step 3 verified the branch
    assert (m.steps_after_rejection, m.ready_after_rejection, m.branch_drafts) == (1, 1, 1)
    assert m.accepted == 2 + 4 and m.rejections == 1
    samples = read_samples(exposition(m, {}))
    assert [samples[f"duo_{name}_total"] for name in ("steps_after_rejection",
            "ready_after_rejection", "branch_drafts", "accepted_tokens")] == [1, 1, 1, 6]


def test_a_rejection_with_no_branch_for_its_correction_finds_no_draft_ready() -> None:
    prompt = [1, 2, 3]
    truth = asyncio.run(_reply(Engine(FakeModel(eos_bias=-100.0)), prompt, 30))
    engine = Engine(FakeModel(eos_bias=-100.0), max_draft=4, draft_len=4)
    feed = attach(engine)
    wrong = truth[3] % 90 + 1
    other = next(t for t in range(1, 90) if t not in (truth[3], wrong))  # a root never emitted

    def tree(engine: Engine, s: Session) -> None:
        if s.n_generated == 1:
            feed.post_draft(s.id, 4, [truth[1], truth[2], wrong, truth[4]], None, "b",
                            [Branch(2, (other, *truth[4:8]))])

    assert asyncio.run(_reply(engine, prompt, 30, tree)) == truth
    m = engine.metrics
    assert (m.steps_after_rejection, m.ready_after_rejection, m.branch_drafts) == (1, 0, 0)


# --- junk through the API ---


def test_junk_trees_are_refused_naming_the_field_and_lead_keeps_serving() -> None:
    client = TestClient(create_app(make_settings(max_tokens=8), FakeModel()))
    base = {"session_id": "x", "start": 0, "token_ids": [1, 2, 3], "back_id": "b"}
    dist = {"token_ids": [1], "probs": [1.0]}
    cases = [
        ([{"at": 0, "token_ids": [5, 10**6]}], "vocabulary", "branches[0].token_ids"),
        ([{"at": 1, "token_ids": [4], "dists": [dist]}, {"at": 0, "token_ids": [4, 5],
          "dists": [dist, {"token_ids": [2, 96], "probs": [0.5, 0.5]}]}],
         "vocabulary", "branches[1].dists[1].token_ids"),
        ([{"at": 3, "token_ids": [5]}], "past the main chain", None),
        ([{"at": -1, "token_ids": [5]}], "at", "branches[0].at"),
        ([{"at": 1, "token_ids": [2, 5]}], "main chain's own token", None),
        ([{"at": 0, "token_ids": [4]}, {"at": 1, "token_ids": [4], "dists": [dist]}],
         "every branch or on none", None),
        ([{"at": 0, "token_ids": []}], "token_ids", "branches[0].token_ids"),
        ([{"at": 0, "token_ids": list(range(4, 21))}], "at most 16", "branches[0].token_ids"),
        ([{"at": 0, "token_ids": [4]}] * 9, "branches", "branches"),
        ([{"at": 0, "token_ids": [4] * 17}] * 8, "128 tokens in all", None),
        ([{"at": 0, "token_ids": [4], "parent": 2}], "parent", "branches[0].parent"),
    ]
    with client.websocket_connect("/duo/link") as ws:
        for branches, fragment, param in cases:
            dists = [dist] * 3 if "dists" in branches[0] else None
            error = link_post(ws, {**base, "dists": dists, "branches": branches})
            assert error and error["status"] == 400 and fragment in error["message"], \
                (branches, error)
            assert param is None or error["param"] == param, (branches, error)
        invalid = read_samples(client.get("/metrics").text)["duo_draft_posts_invalid_total"]
        assert invalid == 3  # lead's checks
        reply = client.post("/v1/chat/completions", json=chat_body("still there?"))
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
        # a well-formed tree of no live session: stale, not refused
        assert link_post(ws, {**base, "branches": [{"at": 0, "token_ids": [4]}]}) is None


# --- in process: a back posting trees on the link ---


async def tree_back(ws: AsyncWebSocketSession, twin: FakeModel) -> None:
    """A scripted back: its main chain is wrong at index 1, its branch there is right.
    It posts again only once lead's tokens reach past its last post, so the step after
    each rejection finds the branch on the board with no new post."""
    await ws.send_text(json.dumps({"type": "hello", "back_id": "tree"}))
    tokens: dict[str, list[int]] = {}
    reaches = 0
    while True:
        update = json.loads(await ws.receive_text())
        assert update["type"] == "update", update  # (a refusal: the post was wrong)
        for news in update["sessions"]:
            held = tokens.setdefault(news["session_id"], [])
            held[news["offset"]:] = news["token_ids"]
            if news["done"] or len(held) < reaches:
                continue
            truth = twin.greedy_continuation(held, 8)
            main = [truth[0], truth[1] % 90 + 1, *truth[2:6]]
            branch = {"at": 1, "token_ids": truth[1:8]}
            await ws.send_text(json.dumps({"type": "draft", "draft": {
                "session_id": news["session_id"], "start": len(held), "token_ids": main,
                "back_id": "tree", "branches": [branch]}}))
            reaches = len(held) + 8


async def with_tree_back(cost_s: tuple[float, float] = TARGET_COST, **settings: object
                         ) -> tuple[str, dict[str, float], FakeModel]:
    """A reply of a lead over a fake target (`cost_s`, `settings`) with tree_back posting
    to it on the link: its text, lead's /metrics after it, and the target."""
    app, target = new_lead(cost_s, **settings)
    twin = FakeModel(eos_bias=-100.0)  # the target's own greedy continuation
    async with ASGIWebSocketTransport(app=app) as transport, \
            httpx.AsyncClient(transport=transport, base_url="http://lead") as http, \
            aconnect_ws("http://lead/duo/link", http) as ws:
        back = asyncio.create_task(tree_back(ws, twin))
        try:
            reply = await ask(transport)
        finally:
            back.cancel()
            await asyncio.gather(back, return_exceptions=True)
        metrics = (await http.get("/metrics")).text
    counters = read_samples(metrics)
    return text_of(reply), counters, target


def test_a_back_posting_trees_on_the_link_changes_no_output_and_its_branches_are_used() -> None:
    async def body() -> None:
        alone = await reference()
        text, counters, _ = await with_tree_back(draft_len=4)
        assert text == alone
        assert counters["duo_branch_drafts_total"] >= 1, counters
        assert counters["duo_ready_after_rejection_total"] >= 1, counters
        assert counters["duo_steps_after_rejection_total"] >= \
            counters["duo_ready_after_rejection_total"]
    run(body())

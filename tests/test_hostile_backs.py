"""A hostile back cannot steer replies, win the board with junk, or crowd good backs out.

- Trust: an untrusted back's draft probabilities are dropped, so a forged q cannot bias
  sampling (chi-square, as tests/test_sampling_exact.py); the same post from a trusted
  back does bias it (the check has power).
- Ranking: the board verifies the draft expected to yield most at its back's own
  acceptance: long junk beside a good back loses after one step and stays lost.
- Caps per address: board places, registry records, open links; arrivals wake the
  live panel at a bounded rate (on an injected clock).
- The grammar goes to a back once per session, not in every state.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter

import httpx
import numpy as np
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from back.client import LeadClient
from back.drafter import ModelDrafter
from back.worker import Worker
from bench.fake import FakeModel
from lead.backs.feed import BackFeed, attach
from lead.backs.keys import Keys
from lead.backs.limits import BACKS_PER_ADDRESS, LINKS_PER_ADDRESS
from lead.backs.registry import BackRegistry
from lead.backs.routes import back_router
from lead.decode.engine import Engine, GenRequest
from lead.decode.metrics import Metrics
from lead.decode.runs import Run
from lead.decode.session import Session
from lead.decode.verify import verify
from lead.drafts.board import Candidate, Draft, DraftBoard
from lead.policy.acceptance import accepted_curve, expected_accepted
from lead.policy.cost import CostModel
from lead.policy.scoreboard import Offer, Scoreboard
from lead.server.app import create_app
from lead.server.prometheus import exposition
from shared.placement import LeadPlace
from shared.sampling import Dist
from shared.wire.protocol import SamplingParams, SessionState, Update, grammar_id
from shared.wire.scrape import read_samples
from tests.conftest import InProcessLead, async_wait_until, make_settings
from tests.test_link import link_post
from tests.test_sampling_exact import (
    PARAMS,
    TRIALS,
    chi_square_ok,
    exact_joint,
    p_of,
    target_logits,
)

# --- trust: forged draft probabilities ---


def forged(context: list[int]) -> tuple[list[int], list[Dist]]:
    """Two draft tokens, each the one p makes least likely, each claimed drawn with
    probability 1e-6: rejection sampling would accept them always (p/q >= 1)."""
    draft: list[int] = []
    for _ in range(2):
        unlikely = int(np.argmin(p_of(context + draft)[:4]))
        draft.append(unlikely)
    q = [Dist(np.array([t, 4]), np.array([1e-6, 1 - 1e-6])) for t in draft]
    return draft, q


def forged_pair(feed: BackFeed, rng: np.random.Generator, trusted: bool) -> tuple[int, int]:
    """One reply's first two tokens with a back posting forged drafts before every step,
    through lead's feed, board and verifier."""
    out: list[int] = []
    feed.start(Session(id="s", tokens=out, n_prompt=0, params=PARAMS, rng=rng))
    while len(out) < 2:
        draft, q = forged(out)
        feed.post_draft("s", len(out), draft, q, "mallory", address="10.6.6.6", trusted=trusted)
        board = feed.board_of("s")
        assert board is not None
        offered = board.best(out, 3)
        assert offered is not None and offered.token_ids == draft
        rows = np.stack([target_logits(out + draft[:i]) for i in range(len(draft) + 1)])
        out += verify(draft, rows, PARAMS, rng, offered.dists).emitted
    return out[0], out[1]


@pytest.mark.parametrize("trusted", [False, True])
def test_forged_probabilities_bias_sampling_only_from_a_trusted_back(trusted: bool) -> None:
    metrics = Metrics()
    feed = BackFeed(CostModel(max_draft=3, fixed=3), metrics)
    rng = np.random.default_rng(20261125)
    counts = Counter(forged_pair(feed, rng, trusted) for _ in range(TRIALS))
    ok, stat, critical = chi_square_ok(counts, exact_joint(), TRIALS)
    print(f"\ntrusted={trusted}: chi2 {stat:.1f} vs critical {critical:.1f}")
    assert ok is not trusted, f"trusted={trusted}: chi2 {stat:.1f} vs {critical:.1f}"
    assert (metrics.drafts_untrusted > 0) is not trusted


def board_of(feed: BackFeed, session_id: str) -> DraftBoard:
    board = feed.board_of(session_id)
    assert board is not None
    return board


def keyed_lead(keys: Keys) -> tuple[TestClient, BackFeed, Session]:
    """The back routes alone over a fake target with `keys`, its feed, and a live session."""
    engine = Engine(FakeModel(), max_draft=8, draft_len=4)
    feed = attach(engine)
    app = FastAPI()
    app.include_router(back_router(engine, feed, LeadPlace("host", frozenset({0}), 1),
                                   keys=keys))
    session = Session(id="s1", tokens=[1, 2, 3], n_prompt=3,
                      params=SamplingParams(temperature=1.0), rng=np.random.default_rng(0))
    feed.start(session)
    return TestClient(app), feed, session


DIST = {"token_ids": [5, 6], "probs": [0.5, 0.5]}
POST = {"session_id": "s1", "start": 3, "token_ids": [5, 7], "dists": [DIST, DIST],
        "branches": [{"at": 1, "token_ids": [6], "dists": [DIST]}]}


@pytest.mark.parametrize(("key", "kept"), [("api", False), ("back", True), (None, False)])
def test_dists_count_only_from_a_back_with_the_back_key(key: str | None, kept: bool) -> None:
    client, feed, session = keyed_lead(Keys(api_key="api", back_key="back"))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with client.websocket_connect("/duo/link", headers=headers) as ws:
        assert link_post(ws, {**POST, "back_id": "b"}) is None
    main, branch = board_of(feed, "s1").candidates["b@testclient"]
    assert (main.dists is not None, branch.dists is not None) == (kept, kept)
    assert feed.metrics.drafts_untrusted == (0 if kept else 1)
    text = exposition(feed.metrics, {})
    assert read_samples(text)["duo_draft_posts_untrusted_total"] == (0 if kept else 1)


def test_without_any_key_every_back_is_trusted() -> None:
    client, feed, _ = keyed_lead(Keys())
    with client.websocket_connect("/duo/link") as ws:
        assert link_post(ws, {**POST, "back_id": "b"}) is None
    assert board_of(feed, "s1").candidates["b@testclient"][0].dists is not None


# --- ranking: expected yield at each back's own acceptance ---


def test_expected_accepted_is_the_geometric_sum() -> None:
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)
    assert expected_accepted([0.0] * 8) == 0.0 and expected_accepted([]) == 0.0
    assert expected_accepted([0.9]) == pytest.approx(0.9)
    assert accepted_curve([0.5, 0.5, 0.5]) == pytest.approx([0.0, 0.5, 0.75, 0.875])
    assert accepted_curve([0.2, 1.0, 0.5]) == pytest.approx([0.0, 0.2, 0.4, 0.5])  # per token


def test_junk_loses_after_one_step_and_a_new_good_back_wins_at_once() -> None:
    board = DraftBoard()
    truth = list(range(1, 30))
    tokens = truth[:2]

    def post(back: str, ids: list[int]) -> None:
        assert board.post(tokens, Candidate(back, len(tokens), tuple(ids)))

    def step() -> Draft | None:  # as the engine plans one: every offer watched
        board.scores.offered("s", tokens, False, board.offers(tokens))
        return board.best(tokens, 8)

    post("good", truth[2:5])
    post("junk", [50] * 16)
    assert step().back_id == "junk"  # type: ignore[union-attr]  # both untried: the longer
    tokens = truth[:3]  # that step rejected junk's first token
    board.scores.settle("s", tokens)
    for _ in range(5):
        post("good", truth[len(tokens):len(tokens) + 3])
        post("junk", [50] * 16)
        draft = step()
        assert draft is not None and draft.back_id == "good"
        tokens = truth[:len(tokens) + 2]
        board.scores.settle("s", tokens)
    assert board.scores.alpha("junk") < 0.3 < 0.9 < board.scores.alpha("good")
    post("newcomer", truth[len(tokens):len(tokens) + 2])  # shorter than junk's, untried
    post("junk", [50] * 16)
    assert step().back_id == "newcomer"  # type: ignore[union-attr]


def test_a_back_good_for_long_that_turns_to_junk_loses_within_two_steps() -> None:
    scores = Scoreboard()
    for _ in range(30):
        scores.record("turncoat", 4, False)  # right every time, for long
        scores.record("steady", 3, True)  # three right, then a miss
    steps = 0
    while scores.alpha("turncoat") >= scores.alpha("steady"):
        scores.record("turncoat", 0, True)  # junk from now on
        scores.record("steady", 3, True)
        steps += 1
    assert steps <= 2, steps


def test_backs_are_scored_on_what_lead_emits_whether_chosen_or_not() -> None:
    scores = Scoreboard()
    scores.offered("s", [0, 0, 0], False, {"a": Offer((7, 8, 9)), "b": Offer((7, 1)),
                                           "c": Offer((2,))})
    scores.settle("s", [0, 0, 0, 7, 8])  # lead emitted 7, 8: b and c missed
    assert set(scores.records) == {"b", "c"}  # a's draft goes on: not settled yet
    scores.settle("s", [0, 0, 0, 7, 8, 9], final=True)  # the reply ended
    assert scores.alpha("a") > scores.alpha("b") > scores.alpha("c")
    before = {key: record.alpha for key, record in scores.records.items()}
    scores.offered("s", [0, 0, 0, 7, 8], False, {"a": Offer((9,))})
    scores.settle("s", [0, 0, 0, 7, 8])  # no step since: nothing to compare
    assert {key: record.alpha for key, record in scores.records.items()} == before


def test_a_good_back_beside_long_junk_is_verified_and_junk_is_not() -> None:
    """Lead decodes over a fake target; before every step a good back posts the target's
    own next 6 tokens and a junk back 16 wrong ones. Ranked by reach, junk would be
    verified at every step; ranked by expected yield, at most twice: its miss at the
    reply's first token tells only of first tokens (estimated apart), the next one of
    the rest."""
    prompt = [1, 2, 3]
    reference = FakeModel(eos_bias=-100.0).greedy_continuation(prompt, 80)
    engine = Engine(FakeModel(eos_bias=-100.0), max_draft=8, draft_len=4)
    feed = attach(engine)
    chosen: list[str | None] = []
    original = engine._offered

    def offered_after_posts(run: Run):  # type: ignore[no-untyped-def]
        s = run.session
        tokens, at = s.tokens, len(s.tokens) - len(prompt)
        wrong = 1 if reference[at] != 1 else 2
        feed.post_draft(s.id, len(tokens), reference[at:at + 6], None, "good")
        feed.post_draft(s.id, len(tokens), [wrong] + [9] * 15, None, "junk")
        draft = original(run)
        chosen.append(draft.back_id if draft else None)
        return draft

    engine._offered = offered_after_posts  # type: ignore[method-assign]

    async def reply() -> Session:
        async for e in engine.generate(GenRequest(prompt_ids=list(prompt), max_tokens=60)):
            if e.session is not None:
                return e.session
        raise AssertionError("no last emission")

    session = asyncio.run(reply())
    assert session.tokens[len(prompt):] == reference[:60]
    assert chosen.count("junk") <= 2 and "junk" not in chosen[2:], chosen
    assert session.drafted_by_back.get("junk", 0) <= 2 * 4  # draft_len 4, twice at most
    assert session.accepted_by_back["good"] >= 40, session.accepted_by_back


# --- caps per address ---


def test_one_address_holds_at_most_its_share_of_board_places() -> None:
    board, tokens = DraftBoard(), [1, 2]

    def post(back: str, address: str, ids: tuple[int, ...] = (3, 4)) -> bool:
        return board.post(tokens, Candidate(back, 2, ids, address=address))

    assert all(post(f"id{i}", "10.0.0.1") for i in range(BACKS_PER_ADDRESS))
    assert not post("id-new", "10.0.0.1") and board.stale == 1
    assert post("id0", "10.0.0.1", (3, 5))  # a back on the board keeps its place
    assert post("good", "10.0.0.2")  # other addresses are not crowded out
    assert post("id0", "10.0.0.9", (3, 9))  # the same id elsewhere is another back...
    assert board.candidates["id0@10.0.0.1"][0].token_ids == (3, 5)  # ...and replaces nothing
    tokens = [1, 2, 7]  # lead went another way: the address's drafts are dead
    assert post("id-new", "10.0.0.1", (7, 8))


def test_made_up_ids_from_one_address_push_out_only_each_other() -> None:
    reg = BackRegistry()
    reg.seen("good", now=0.0, address="10.0.0.2")
    for i in range(50):
        reg.seen(f"fake{i}", now=1.0 + i, address="10.0.0.1")
    from_one = [k for k, r in reg.records.items() if r.address == "10.0.0.1"]
    assert sorted(from_one) == [f"fake{i}" for i in range(46, 50)]
    assert "good" in reg.connected(now=50.0)


def test_a_post_from_a_fifth_back_of_one_address_is_a_429_that_says_why() -> None:
    client, _, _ = keyed_lead(Keys())
    body = {"session_id": "s1", "start": 3, "token_ids": [5, 6]}
    with client.websocket_connect("/duo/link") as ws:
        for i in range(BACKS_PER_ADDRESS):
            assert link_post(ws, {**body, "back_id": f"b{i}"}) is None
        refused = link_post(ws, {**body, "back_id": "b-extra"})
        assert refused and refused["status"] == 429 and refused["retry_after"] == 1
        assert "hold drafts on lead's board" in refused["message"]
        assert link_post(ws, {**body, "back_id": "b0"}) is None


def test_links_per_address_are_capped_and_freed() -> None:
    app = create_app(make_settings(calibrate=False), FakeModel())
    feed = app.state.feed  # type: ignore[attr-defined]
    with TestClient(app) as client:
        with contextlib.ExitStack() as links:
            for _ in range(LINKS_PER_ADDRESS):
                ws = links.enter_context(client.websocket_connect("/duo/link"))
                assert link_post(ws, {"session_id": "s", "start": 0, "token_ids": [1]}) is None
            assert feed.links.open == {"testclient": LINKS_PER_ADDRESS}
            with client.websocket_connect("/duo/link") as extra, \
                    pytest.raises(WebSocketDisconnect) as closed:
                extra.receive_text()
            assert closed.value.code == 1013 and "too many links" in closed.value.reason
        with client.websocket_connect("/duo/link") as ws:  # the places are free again
            assert link_post(ws, {"session_id": "s", "start": 0, "token_ids": [1]}) is None
            assert feed.links.open == {"testclient": 1}


def test_arrivals_wake_the_live_panel_at_a_bounded_rate() -> None:
    now = [0.0]
    wakes: list[float] = []
    feed = BackFeed(CostModel(max_draft=8), Metrics(), lambda: wakes.append(now[0]),
                    clock=lambda: now[0])
    for i in range(100):
        feed.back_seen(f"made-up-{i}", f"10.0.{i}.1")
    assert wakes == [0.0] and len(feed.backs.records) == 100  # all seen, one wake
    now[0] = 0.5
    feed.back_seen("another", "10.1.0.1")
    assert wakes == [0.0]
    now[0] = 1.0
    feed.back_seen("one-more", "10.1.0.2")
    feed.back_seen("another", "10.1.0.1")  # known: no arrival
    assert wakes == [0.0, 1.0]


# --- the grammar, once per session ---


class Recording(InProcessLead):
    """Lead in process, keeping each HTTP request's path."""

    def __init__(self, app: object) -> None:
        super().__init__(app)
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return await super().handle_async_request(request)


WORDS = ["abc cab " * 8, "bad dab " * 8, "ace face " * 7]  # long replies: drafts pay
GRAMMAR = "root ::= " + " | ".join(f'"{w}"' for w in WORDS)


def test_a_back_gets_the_grammar_once_and_drafts_under_it() -> None:
    """States name the grammar by its id and never carry its text; the back fetches the
    text once (its second session names the same grammar) and drafts under it."""
    async def body() -> None:
        target = FakeModel(cost_s=(0.003, 0.0005), eos_bias=-100.0)
        app = create_app(make_settings(max_tokens=60, draft_len=4), target)
        draft = FakeModel(salt="draft", agree=0.8, cost_s=(0.0005, 0.0))
        drafter = ModelDrafter(draft)
        async with Recording(app) as transport:
            worker = Worker(LeadClient("http://lead", transport=transport),
                            drafter, draft.fingerprint(), draft.n_vocab, back_id="m")
            news: list[SessionState] = []
            take = worker._take

            def taking(update: Update) -> None:
                news.extend(update.sessions)
                take(update)
            worker._take = taking  # type: ignore[method-assign]
            task = asyncio.create_task(worker.run())
            try:
                await async_wait_until(lambda: worker.version >= 0, what="handshake")
                async with httpx.AsyncClient(transport=transport, base_url="http://lead") \
                        as http:
                    for _ in range(2):  # two sessions with the same grammar
                        r = await http.post("/v1/chat/completions", json={
                            "messages": [{"role": "user", "content": "hi"}],
                            "grammar": GRAMMAR})
                        assert r.status_code == 200
                        assert r.json()["usage"]["accepted_tokens"] > 0
            finally:
                worker.stop()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        constrained = [s for s in news if s.grammar_id is not None]
        assert constrained and {s.grammar_id for s in constrained} == {grammar_id(GRAMMAR)}
        assert all(s.sampling is None or s.sampling.grammar is None for s in news)  # no text
        assert transport.paths.count("/duo/grammar") == 1  # once, kept by its id
        assert worker.grammars == {grammar_id(GRAMMAR): GRAMMAR}  # its mirrors' too
        assert drafter.grammars.followed is not None  # it drafted under the grammar
    asyncio.run(asyncio.wait_for(body(), 60))


def test_the_grammar_of_a_session_lead_does_not_hold_is_a_404() -> None:
    client, feed, _ = keyed_lead(Keys())
    assert client.get("/duo/grammar", params={"session": "s1"}).status_code == 404  # none
    s = Session(id="s2", tokens=[1], n_prompt=1, params=SamplingParams(grammar=GRAMMAR),
                rng=np.random.default_rng(0))
    feed.start(s)
    got = client.get("/duo/grammar", params={"session": "s2"}).json()
    assert got == {"session_id": "s2", "grammar_id": grammar_id(GRAMMAR), "grammar": GRAMMAR}
    assert client.get("/duo/grammar", params={"session": "s1"}).status_code == 404
    with client.websocket_connect("/duo/link") as ws:  # news names it, without its text
        ws.send_text(json.dumps({"type": "hello"}))
        news = json.loads(ws.receive_text())["sessions"][-1]
    assert news["sampling"].get("grammar") is None and news["grammar_id"] == grammar_id(GRAMMAR)


"""Lead's memory of finished sessions for its own drafts: what the index copies, what the
budget drops, the odds it is priced by, and the engine drafting a reply asked for again
from the last one, exactly."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.fake import FakeModel, VirtualClock
from lead.decode.engine import Engine
from lead.decode.session import GenRequest, Session
from lead.drafts.board import Candidate, DraftBoard
from lead.drafts.copier import FOLLOWED
from lead.drafts.edits import FOLLOWING
from lead.drafts.memory import Memory, Recalled
from lead.drafts.own import OWN, OwnDrafts
from lead.policy.scoreboard import Offer, Scoreboard
from shared.ngram import KEPT, LONGEST


def remembering(*sessions: list[int], budget: int = 1000) -> Memory:
    memory = Memory(budget)
    for tokens in sessions:
        memory.add(tokens)
    return memory


def test_a_lookup_copies_what_followed_the_remembered_occurrence_agreeing_longest() -> None:
    memory = remembering([9, 1, 2, 3, 4, 5, 6], [7, 1, 2, 3, 8, 9])
    match = memory.lookup([0, 9, 1, 2, 3], 3)  # 9 before (1, 2, 3) as in the first session
    assert match is not None and match.token_ids == (4, 5, 6) and match.length == 4
    assert memory.lookup([5, 1, 2, 3], 3) is None  # agreeing 3 tokens with both, which part


def test_occurrences_agreeing_as_long_are_copied_as_far_as_they_agree() -> None:
    prompt = [40, 41, 42, 43, 44]
    memory = remembering([*prompt, 1, 2, 3, 4], [*prompt, 1, 2, 7, 8], [*prompt, 1])
    match = memory.lookup(prompt, 4)  # the replies parted at their third token
    assert match is not None and match.token_ids == (1, 2) and match.length == 5
    match = memory.lookup([*prompt, 1, 2, 7], 4)  # this reply took the second's way
    assert match is not None and match.token_ids == (8,) and match.length == 8


def test_a_repeated_prompt_finds_its_reply_agreeing_as_far_as_measured() -> None:
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(100, 10_000, 200)]
    memory = remembering([*prompt, 1, 2, 3, 4, 5])
    match = memory.lookup(prompt, 4)
    assert match is not None and match.token_ids == (1, 2, 3, 4) and match.length == LONGEST


def test_nothing_remembered_or_too_short_no_match() -> None:
    assert remembering([1, 2, 3, 4]).lookup([1, 2, 3], 4) is not None
    assert remembering([1, 2, 3, 4]).lookup([2, 3, 4], 4) is None  # nothing followed it
    assert remembering([1, 2, 3, 4]).lookup([2, 3], 4) is None
    assert remembering([1, 2, 3, 4]).lookup([1, 2, 3], 0) is None
    assert remembering([1, 2, 3], budget=1000).size == 0  # no key a token follows
    assert remembering([1, 2, 3, 4, 5], budget=0).size == 0


def test_the_budget_drops_the_oldest_sessions_and_every_place_they_held() -> None:
    first, last = [1, 2, 3, 4], [1, 2, 3, 7]
    others = [[10 * n, 10 * n + 1, 10 * n + 2, 10 * n + 3] for n in range(2, 6)]
    memory = remembering(first, *others, last, budget=16)  # 4 tokens a session at most
    assert memory.size == 16 and list(memory.sessions.values()) == [
        *map(tuple, others[1:]), tuple(last)]
    match = memory.lookup([1, 2, 3], 3)
    assert match is not None and match.token_ids == (7,)  # the first's (4,) is gone
    assert all(n not in (0, 1) for places in memory._ends.values() for n, _ in places)
    assert (20, 21, 22) not in memory._ends


def test_a_session_keeps_its_last_quarter_of_the_budget_and_a_key_its_latest_places() -> None:
    memory = remembering(list(range(100)), budget=40)
    assert memory.sessions[0] == tuple(range(90, 100))
    many = remembering(*[[n, 1, 2, 3, n] for n in range(KEPT + 5)])
    assert len(many._ends[(1, 2, 3)]) == KEPT
    assert many.lookup([KEPT + 4, 1, 2, 3], 1).token_ids == (KEPT + 4,)  # type: ignore[union-attr]
    assert many.lookup([4, 1, 2, 3], 1) is None  # its own no longer kept: the rest part


# --- lead's own drafts ---


def copied(own: OwnDrafts, session_id: str, tokens: list[int]) -> tuple[int, ...] | None:
    """The copy lead verifies: each kind's proposal on a board, the best of them."""
    board = DraftBoard()
    for kind, p in own.propose(session_id, tokens).items():
        board.post(tokens, Candidate(OWN, len(tokens), p.token_ids, known=p.known,
                                     scale=p.scale, kind=kind))
    best = board.best(tokens, 64)
    return tuple(best.token_ids) if best is not None else None


def test_own_drafts_copy_a_finished_session_and_learn_its_p_accept_apart() -> None:
    own, scores = OwnDrafts(longest=4, memory=1000), Scoreboard()
    prompt, reply = [5, 6, 7, 8, 9], [20, 21, 22, 23, 24]
    assert own.propose("s1", prompt) == {}
    own.forget("s1", [*prompt, *reply])
    proposals = own.propose("s2", prompt)
    assert list(proposals) == ["memory"]  # the session itself holds no match
    proposal = proposals["memory"]
    assert proposal.token_ids == (20, 21, 22, 23) and proposal.known == (5, 6, 7, 8)
    scores.offered("s2", prompt, False, {f"{OWN}:memory": Offer(
        proposal.token_ids, proposal.known, proposal.scale, back=False)})
    scores.settle("s2", [*prompt, 20, 21, 30])  # two right, then a miss
    assert f"{OWN}:ngram" not in scores.records  # the other kind's record: untouched
    learned = scores.known_p_accept(f"{OWN}:memory", proposal.known, proposal.scale)
    assert learned != scores.known_p_accept(f"{OWN}:ngram", proposal.known, proposal.scale)


def test_the_sessions_own_copy_wins_unless_a_remembered_one_agrees_longer() -> None:
    own = OwnDrafts(longest=2, memory=1000)
    own.forget("old", [1, 2, 3, 50, 51])
    # the session itself holds (4, 1, 2, 3) -> 60: agreeing 4 tokens, longer than the 3
    assert copied(own, "s", [4, 1, 2, 3, 60, 61, 4, 1, 2, 3]) == (60, 61)
    assert copied(own, "t", [9, 9, 8, 1, 2, 3]) == (50, 51)
    assert list(OwnDrafts(longest=2, memory=0).kinds) == ["ngram"]


def test_a_remembered_copy_agreeing_longer_but_stopping_sooner_loses_to_the_sessions() -> None:
    # a reply of one token repeated: a key's latest places are the remembered session's
    # last few, so its copy stops within 8 tokens, where the session's own runs on to 64
    prompt = list(range(100, 140))
    own = OwnDrafts(longest=64, memory=65536)
    own.forget("old", prompt + [5] * 300)
    memory = own.kinds["memory"]
    assert isinstance(memory, Recalled)
    recalled = memory.memory.lookup(prompt + [5] * 20, 64)
    assert recalled is not None and len(recalled.token_ids) <= 8
    assert copied(own, "new", prompt + [5] * 20) == (5,) * 64


def test_a_reply_asked_again_is_followed_on_past_a_token_where_it_parted() -> None:
    # the same reply again but for one token at 40 (a near-tie that went the other way in
    # a batch), the same after it; distinct tokens: no match but the copy's own
    rng = np.random.default_rng(3)
    prompt = [int(t) for t in rng.permutation(np.arange(100, 1100))[:30]]
    reply = [int(t) for t in rng.permutation(np.arange(2000, 3000))[:120]]
    again = [*reply[:40], 5, *reply[41:]]
    recalled = Recalled(4096)
    recalled.end("old", prompt + reply)
    first = recalled.draft("new", prompt, 64)  # the whole prompt agrees: a copy followed
    assert first is not None and first.token_ids == tuple(reply[:64])
    assert first.scale is FOLLOWED  # priced as one
    assert Scoreboard().known_p_accept("k", first.known[:1], FOLLOWED)[0] == \
        pytest.approx(FOLLOWING[24])
    copies = [recalled.copy("new", prompt + again[:i], 64)[0] for i in range(1, 44)]
    for i in (41, 42, 43):  # from the token after the one that parted, on
        copy = copies[i - 1]
        assert copy is not None and copy.token_ids[:40] == tuple(again[i:i + 40])
        # where a lookup alone has nothing: no KEY tokens since the change agree
        assert i > 42 or recalled.memory.lookup(prompt + again[:i], 64) is None


# --- the engine ---


def reply_twice(memory: int) -> tuple[list[int], list[int], Session]:
    """The same prompt twice (greedy) from a fake whose reply is no echo of its prompt."""
    clock = VirtualClock()
    model = FakeModel(n_vocab=256, order=8, eos_bias=-50.0, clock=clock)
    engine = Engine(model, max_draft=8, ngram=64, memory=memory, clock=clock)
    engine.cost.fix_prices([1.3, 1.6, 1.9])  # a batch dear, as on a CPU
    prompt = [1, *range(10, 40), 2]

    async def run() -> list[int]:
        async for _ in engine.generate(GenRequest(prompt, 120)):
            pass
        session = engine.session
        assert session is not None
        return session.tokens[len(prompt):]

    first = asyncio.run(run())
    second = asyncio.run(run())
    session = engine.session
    assert session is not None
    return first, second, session


def test_a_reply_asked_for_again_is_drafted_from_the_last_and_emitted_exactly() -> None:
    first, second, again = reply_twice(memory=4096)
    assert len(first) == 120 and second == first
    assert again.accepted_by_back.get(OWN, 0) > 100
    assert again.steps < 120 / 4
    _, _, forgotten = reply_twice(memory=0)
    assert forgotten.accepted_by_back.get(OWN, 0) < 10 and forgotten.steps > 100

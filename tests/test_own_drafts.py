"""Lead's own drafts: the n-gram index, the odds per match length, the cost model's length
for a draft with per-token odds, and the engine verifying its own copies of the prompt
(an edit echoed back) exactly, beside and against a back's drafts."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bench.fake import FakeModel, VirtualClock
from lead.decode.engine import Engine
from lead.decode.session import GenRequest
from lead.drafts.board import Candidate, DraftBoard
from lead.drafts.copier import MATCHED
from lead.drafts.own import OWN, OwnDrafts
from lead.policy.acceptance import Bands, Rate, expected_accepted
from lead.policy.cost import CostModel
from lead.policy.scoreboard import Offer, Scoreboard
from shared.ngram import KEPT, LONGEST, NgramIndex

# --- the index ---


def indexed(tokens: list[int]) -> NgramIndex:
    index = NgramIndex()
    index.sync(tokens)
    return index


def test_a_lookup_copies_what_followed_the_longest_match_of_the_end() -> None:
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13 14 15
    tokens = [9, 1, 2, 3, 4, 5, 7, 1, 2, 3, 6, 8, 9, 1, 2, 3]
    match = indexed(tokens).lookup(3)
    # (1, 2, 3) ended at 4 and at 10; before 4 stands 9 as before the end: a longer match
    assert match is not None and match.token_ids == (4, 5, 7) and match.length == 4


def test_equal_matches_copy_the_latest_and_a_copy_near_the_end_reads_itself() -> None:
    tokens = [1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3]
    assert indexed(tokens).lookup(2).token_ids == (6, 1)  # type: ignore[union-attr]
    pattern = [4, 7, 8, 4, 7, 8, 4, 7, 8]
    match = indexed(pattern).lookup(7)
    assert match is not None and match.token_ids == (4, 7, 8, 4, 7, 8, 4)


def test_nothing_before_no_match() -> None:
    assert indexed([1, 2, 3, 4, 5]).lookup(4) is None
    assert indexed([1, 2]).lookup(4) is None
    assert indexed([1, 2, 3, 1, 2, 3]).lookup(0) is None


def test_the_index_grows_with_its_sequence_and_starts_over_for_another() -> None:
    index = NgramIndex()
    index.sync([1, 2, 3, 4])
    index.sync([1, 2, 3, 4, 1, 2, 3])  # extends: only the new ends are indexed
    assert index.lookup(1).token_ids == (4,)  # type: ignore[union-attr]
    index.sync([7, 2, 3, 4, 2, 3, 4])  # not an extension: indexed afresh
    assert index.tokens == [7, 2, 3, 4, 2, 3, 4]
    assert index.lookup(2).token_ids == (2, 3)  # type: ignore[union-attr]


def test_a_match_is_measured_so_far_and_occurrences_kept_so_many() -> None:
    rng = np.random.default_rng(0)
    long = [int(t) for t in rng.integers(100, 10_000, 200)]
    match = indexed(long + [5] + long).lookup(3)
    assert match is not None and match.length == LONGEST and match.token_ids == (5, *long[:2])
    many = [1, 2, 3, 0] * (KEPT + 5) + [1, 2, 3]
    index = indexed(many)
    assert len(index._ends[(1, 2, 3)]) == KEPT


# --- odds per match length ---


PRIOR = dict(MATCHED.priors)


def fresh() -> Bands:
    return MATCHED.bands()


def counts(rate: Rate) -> tuple[float, float]:
    return rate.right, rate.wrong


def test_p_accept_start_from_the_prior_of_their_band_and_learn_within_it() -> None:
    p_accept = fresh()
    assert p_accept[3].value == p_accept[5].value == pytest.approx(PRIOR[3])
    assert p_accept[1].value == pytest.approx(PRIOR[3])  # shorter than the shortest band
    assert p_accept[100].value == pytest.approx(PRIOR[48])
    for _ in range(200):
        p_accept[30].record(True, False)
    assert p_accept[24].value > 0.98 and p_accept[12].value == pytest.approx(PRIOR[12])


def test_own_drafts_learn_from_what_lead_emitted_until_the_first_miss() -> None:
    """A kind's proposal is watched on the scoreboard as a back's draft is, under the
    kind's name; its odds are learned per band of the match each token follows."""
    own, scores, key = OwnDrafts(longest=4), Scoreboard(), f"{OWN}:ngram"
    prompt = [8, 1, 2, 3, 4, 5, 6, 9, 8, 1, 2, 3]  # the end matches 4 tokens back at 1..3
    proposal = own.propose("s1", prompt)["ngram"]
    assert proposal.token_ids == (4, 5, 6, 9) and proposal.known == (4, 5, 6, 7)
    assert scores.known_p_accept(key, proposal.known, proposal.scale) == \
        tuple(fresh()[4 + i].value for i in range(4))
    scores.offered("s1", prompt, False, {key: Offer(proposal.token_ids, proposal.known,
                                                    proposal.scale, back=False)})
    scores.settle("s1", [*prompt, 4, 5, 7])  # two right (matches of 4, 5), then one wrong (6)
    p_accept = scores.record_of(key).bands[MATCHED.name]
    d = 0.995
    assert counts(p_accept[3]) == pytest.approx((PRIOR[3] * 4 * d * d + d + 1,
                                                 (1 - PRIOR[3]) * 4 * d * d))
    assert counts(p_accept[6]) == pytest.approx((PRIOR[6] * 4 * d, (1 - PRIOR[6]) * 4 * d + 1))
    assert scores.alpha(key) < scores.alpha("a back not yet seen")  # two right, a miss
    before = [counts(rate) for rate in p_accept.rates.values()]
    scores.settle("s2", [*prompt, 4, 5, 7])  # another session: nothing watched there
    assert [counts(rate) for rate in p_accept.rates.values()] == before


# --- the length that pays, per token ---

CPU = {1: 1.0, 2: 1.6, 3: 2.2, 4: 2.4, 5: 2.9, 9: 4.9, 17: 7.0, 24: 8.0, 32: 9.0, 48: 12.0,
       65: 15.0}  # a 2-core CPU: a batch of 48 costs about 12 single steps


def priced(shape: dict[int, float]) -> CostModel:
    model = CostModel(max_draft=8, longest=64)
    model.prices.calibrate({b: 0.03 * x for b, x in shape.items()})
    return model


def test_a_copy_that_is_nearly_always_right_is_verified_long_where_batches_are_dear() -> None:
    model = priced(CPU)
    assert model.allocate([[0.97] * 64])[0] >= 24  # ~20 tokens for ~9 steps' price
    assert model.allocate([[0.2] * 64])[0] == 0  # an accidental match: not worth a batch
    # a short match turning long: the odds rise along the draft (lead/drafts/own.py)
    rising = [fresh()[3 + i].value for i in range(64)]
    assert model.allocate([rising])[0] == 0  # at the priors, a 3-token match does not pay
    assert model.allocate([rising[21:]])[0] > 0  # one of 24 does
    assert model.allocate([[0.97] * 5])[0] in (4, 5)  # no further than the draft goes


def test_where_a_batch_costs_about_one_token_the_shortest_length_near_the_best_is_taken() -> None:
    flat = priced({b: 1.0 + 0.001 * b for b in (1, 2, 3, 4, 5, 9, 17, 24, 32, 48, 65)})
    k = flat.allocate([[0.8] * 64])[0]
    assert 10 <= k < 64  # 0.8^k is small long before 64: more tokens add under 1 %


def test_a_forced_length_holds_for_own_drafts_too() -> None:
    model = CostModel(max_draft=8, fixed=3, longest=64)
    assert model.allocate([[0.1] * 10])[0] == 3 and model.allocate([[0.9] * 2])[0] == 2


def test_the_board_ranks_own_drafts_by_their_p_accept_against_backs_by_their_acceptance() -> None:
    board = DraftBoard()
    tokens = [1, 2, 3]
    board.post(tokens, Candidate("b", 3, (4, 5, 6, 7), address="10.0.0.2"))  # alpha 0.8 prior
    board.post(tokens, Candidate(OWN, 3, (4, 5, 9) + (0,) * 30, p_accept=(0.3,) * 33))
    best = board.best(tokens, 8)
    assert best is not None and best.back_id == "b" and best.p_accept is None
    board.post(tokens, Candidate(OWN, 3, tuple(range(40)), p_accept=(0.97,) * 40))
    best = board.best(tokens, 8)
    assert best is not None and best.back_id == OWN and len(best.token_ids) == 40  # not 8
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)


# --- the engine: an edit echoed back ---


class Echo(FakeModel):
    """A target that echoes its prompt's body (tokens 10-200), then ends: an edit
    returned whole. A call costs 10 ms + 1 ms a token on the virtual clock, not slept: no
    back runs beside it."""

    def __init__(self, body: list[int]) -> None:
        super().__init__(n_vocab=256, clock=VirtualClock(), cost_s=(0.01, 0.001))
        self.body = body

    def _spend(self, n_tokens: int, abort: object, started: float) -> None:  # type: ignore[override]
        assert self.clock is not None
        self.clock.advance(self.cost_of(n_tokens))

    def logits_for(self, context: list[int]) -> np.ndarray:  # type: ignore[override]
        i = len(context) - (len(self.body) + 2)  # the prompt: start, body, separator
        token = self.body[i] if 0 <= i < len(self.body) else 0  # then EOS
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[token] = 10.0
        return logits


def echo_reply(ngram: int, prices: list[float]) -> tuple[list[int], object]:
    rng = np.random.default_rng(1)
    body = [int(t) for t in rng.integers(10, 200, 300)]
    model = Echo(body)
    engine = Engine(model, max_draft=8, ngram=ngram, clock=model.clock)  # type: ignore[arg-type]
    engine.cost.fix_prices(prices)

    async def run() -> list[int]:
        out: list[int] = []
        async for e in engine.generate(GenRequest([1, *body, 2], 400)):
            out.extend([] if e.session else [0] * e.n_tokens)
        return out
    asyncio.run(run())
    session = engine.session
    assert session is not None
    return session.tokens[len(body) + 2:], session


@pytest.mark.parametrize("prices", [[1.3, 1.6, 1.9], [1.0]])  # CPU-like; nearly free
def test_lead_verifies_its_own_copy_of_the_prompt_and_emits_the_echo_exactly(
        prices: list[float]) -> None:
    alone, plain = echo_reply(0, prices)
    echoed, own = echo_reply(64, prices)
    assert echoed == alone and len(alone) == 301  # the body, then EOS: exactly
    assert plain.drafted == 0  # type: ignore[attr-defined]
    assert own.accepted_by_back.get(OWN, 0) > 250  # type: ignore[attr-defined]
    assert own.steps < plain.steps / 4  # type: ignore[attr-defined]


def test_where_drafts_never_pay_lead_verifies_none_of_its_own() -> None:
    _, session = echo_reply(64, [2.0, 3.0])  # a batch costs its tokens one at a time
    assert session.drafted == 0  # type: ignore[attr-defined]


"""Per-token odds for backs' drafts: the draft model's probability of each token, mapped
to lead's acceptance as lead learns it per back, decides how far lead verifies a draft
and whose draft it verifies."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from pydantic import ValidationError

from lead.drafts.board import Draft, DraftBoard, Q, post_candidates
from lead.policy.acceptance import Rate
from lead.policy.cost import CostModel
from lead.policy.scoreboard import WEIGHT, Offer, Record, Scoreboard
from shared.wire.protocol import DraftPost

CPU = {1: 1.0, 2: 1.6, 3: 2.2, 4: 2.4, 5: 2.9, 9: 4.9, 17: 7.0}  # a 2-core CPU's batches


def scores_at(alpha: float, *keys: str) -> Scoreboard:
    """A scoreboard where each back of `keys` has acceptance `alpha` (set, not learned:
    a rate that outcomes do not move)."""
    scores = Scoreboard()
    for key in keys:
        scores.records[key] = Record(rest=Rate((1e6 * alpha, 1e6 * (1 - alpha))))
    return scores


def offered(scores: Scoreboard, key: str, probs: Sequence[float], tail: Sequence[int],
            emitted: Sequence[int]) -> None:
    """A back offered `tail` with its q per token; lead then emitted `emitted`."""
    scores.offered("s", [], False, {key: Offer(tuple(tail), tuple(probs), Q)})
    scores.settle("s", list(emitted), final=True)


def test_p_accept_start_from_the_backs_acceptance_and_move_with_each_band_of_q() -> None:
    scores = scores_at(0.7, "b", "other")
    assert scores.known_p_accept("b", [0.05, 0.999], Q) == pytest.approx((0.7, 0.7))
    for _ in range(20):  # sure tokens right, unsure ones wrong
        offered(scores, "b", [0.999, 0.999, 0.2], tail=[5, 6, 7], emitted=[5, 6, 9])
    sure, unsure = scores.known_p_accept("b", [0.995, 0.1], Q)
    assert sure > 0.9 and unsure < 0.2
    assert scores.known_p_accept("other", [0.995], Q) == pytest.approx((0.7,))  # another back


def test_outcomes_are_counted_per_band_up_to_the_first_miss() -> None:
    scores = scores_at(0.5, "b")
    offered(scores, "b", [0.99, 0.99, 0.4, 0.6], tail=[5, 6, 7, 8], emitted=[5, 6, 9, 8])
    bands = scores.record_of("b").bands[Q.name]
    assert (bands[0.99].right, bands[0.99].wrong) == pytest.approx((Q.decay + 1, 0.0))
    assert (bands[0.3].right, bands[0.3].wrong) == pytest.approx((0.0, 1.0))
    assert (bands[0.6].right, bands[0.6].wrong) == (0.0, 0.0)  # after the miss: not observed
    assert bands.band(0.999) == 0.99 and bands.band(0.0) == 0.0 and bands.band(0.94) == 0.85
    assert scores.known_p_accept("b", [0.4], Q) == \
        pytest.approx(((0 + WEIGHT * 0.5) / (1 + WEIGHT),))


def test_a_band_is_the_highest_lower_end_at_or_below_what_is_known() -> None:
    bands = Q.bands()
    for x in [-1.0, 0.0, 0.05, 0.3, 0.5, 0.85, 0.849, 0.99, 1.0, 7.0]:
        assert bands.band(x) == max(b for b in bands.rates if b <= max(x, bands.lowest))
    with pytest.raises(ValueError):
        bands.band(float("nan"))


def test_only_the_latest_drafters_are_kept() -> None:
    scores = Scoreboard(kept=2)
    for key in ("a", "b", "c"):
        offered(scores, key, [0.9], [1], [1])
    assert list(scores.records) == ["b", "c"]


def step(board: DraftBoard, tokens: list[int], limit: int = 8) -> Draft | None:
    """As lead's engine plans a step: every drafter's offer watched, the best drafted."""
    board.scores.offered("s", tokens, False, board.offers(tokens))
    return board.best(tokens, limit)


def priced() -> CostModel:
    model = CostModel(max_draft=8)
    model.prices.calibrate({b: 0.03 * x for b, x in CPU.items()})
    return model


def board_with(probs: list[float], back: str = "b") -> DraftBoard:
    board = DraftBoard()
    main, *rest = post_candidates(back, 3, [4, 5, 6, 7, 8, 9], None, address="10.0.0.2",
                                  probs=probs)
    assert board.post([1, 2, 3], main, rest)
    return board


def test_lead_verifies_a_models_draft_as_far_as_its_confidence_pays() -> None:
    """Where a batch of two costs 1.6 steps, once lead has seen that this back's sure
    tokens are right and its near-ties seldom are, it verifies a draft up to the near-tie."""
    board = board_with([0.999] * 6)
    for _ in range(30):
        offered(board.scores, "b@10.0.0.2", [0.999, 0.999, 0.2], [5, 6, 7], [5, 6, 0])
    sure_then_unsure = [0.999, 0.999, 0.999, 0.2, 0.2, 0.2]
    board.post([1, 2, 3], *post_candidates("b", 3, [4, 5, 6, 7, 8, 9], None,
                                           address="10.0.0.2", probs=sure_then_unsure))
    draft = board.best([1, 2, 3], limit=8)
    assert draft is not None and draft.p_accept is not None
    model = priced()
    assert model.allocate([draft.p_accept]) == [3]
    assert board.best([1, 2, 3], limit=4).token_ids == [4, 5, 6, 7]  # type: ignore[union-attr]
    untaught = board_with(sure_then_unsure).best([1, 2, 3], limit=8)
    assert untaught is not None and len(set(untaught.p_accept or ())) == 1  # the back's alpha


def test_what_a_backs_q_is_worth_is_learned_and_a_liar_loses() -> None:
    """Two backs post the same length, both claiming q = 0.999 per token; one is right,
    the other's tokens are junk. Within a few steps lead ranks the honest one first and
    prices the liar's sure tokens low."""
    board, tokens = DraftBoard(), [1, 2, 3]
    for _ in range(6):
        n = len(tokens)
        honest = post_candidates("honest", n, [n + 1, n + 2, n + 3], None, probs=[0.999] * 3)
        liar = post_candidates("liar", n, [0, 0, 0], None, probs=[0.999] * 3)
        board.post(tokens, *honest)
        board.post(tokens, *liar)
        chosen = step(board, tokens)
        assert chosen is not None
        tokens = [*tokens, n + 1, n + 2, n + 3, n + 4]  # lead accepted the right ones
        board.scores.settle("s", tokens)
    assert chosen.back_id == "honest"
    liar = board.scores.known_p_accept("liar", [0.999], Q)[0]
    honest = board.scores.known_p_accept("honest", [0.999], Q)[0]
    assert liar < 0.3 < 0.9 < honest


def test_a_post_with_probabilities_that_do_not_fit_is_refused() -> None:
    with pytest.raises(ValidationError, match="probs"):
        DraftPost(session_id="s", start=0, token_ids=[1, 2], probs=[0.5])
    with pytest.raises(ValidationError, match="probs"):
        DraftPost(session_id="s", start=0, token_ids=[1], probs=[1.5])
    assert DraftPost(session_id="s", start=0, token_ids=[1], probs=[0.5]).probs == [0.5]

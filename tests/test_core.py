"""Pure pieces: draft board, text stream, drafters, sampling, CLI (the cost model: test_cost.py)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from back.drafter import Drafter, ModelDrafter, NgramDrafter
from bench.fake import FakeModel
from lead.backs.limits import RateLimiter
from lead.backs.registry import BackRegistry
from lead.decode.textstream import TextStream
from lead.drafts.board import Candidate, DraftBoard
from lead.server.settings import LeadSettings
from shared.cli import parse_settings
from shared.sampling import distribution, sample
from shared.wire.protocol import SamplingParams
from tests.conftest import grow

# --- draft board ---


def test_board_keeps_agreeing_candidate_and_returns_its_tail() -> None:
    board = DraftBoard()
    tokens = [1, 2, 3, 4]
    assert board.post(tokens, Candidate("a", 2, (3, 4, 5, 6)))
    draft = board.best(tokens, 8)
    assert draft is not None and draft.token_ids == [5, 6]


def test_board_drops_disagreeing_and_useless_candidates() -> None:
    board = DraftBoard()
    tokens = [1, 2, 3]
    assert not board.post(tokens, Candidate("a", 1, (9, 9, 9)))  # disagrees at position 1
    assert not board.post(tokens, Candidate("a", 0, (1, 2)))  # ends before lead
    assert not board.post(tokens, Candidate("a", 5, (1,)))  # starts past lead: a gap
    assert board.stale == 3 and board.best(tokens, 8) is None


def test_board_prefers_candidate_reaching_furthest_and_forgets_overtaken() -> None:
    board = DraftBoard()
    tokens = [1, 2]
    board.post(tokens, Candidate("short", 2, (3,)))
    board.post(tokens, Candidate("long", 2, (3, 4, 5)))
    assert board.best(tokens, 8).token_ids == [3, 4, 5]
    tokens += [3, 7]  # lead went another way at position 3
    assert board.best(tokens, 8) is None
    assert board.candidates == {}


def test_board_limit_cuts_draft() -> None:
    board = DraftBoard()
    board.post([1], Candidate("a", 1, (2, 3, 4, 5)))
    assert board.best([1], 2).token_ids == [2, 3]


def test_registry_counts_recent_backs() -> None:
    reg = BackRegistry()
    reg.seen("a", now=0.0)
    reg.seen("b", now=50.0)
    assert reg.active(now=70.0) == 1


def test_rate_limiter_allows_rate_then_refuses_then_refills() -> None:
    limiter = RateLimiter(rate=5)
    allowed = [limiter.allow("a", now=0.0) for _ in range(8)]
    assert allowed == [True] * 5 + [False] * 3
    assert limiter.allow("b", now=0.0)  # per client
    assert limiter.allow("a", now=0.5)  # half a second refills 2.5 posts


# --- text stream ---


def test_stop_string_never_leaks_even_across_tokens() -> None:
    stream = TextStream(["</end>"])
    out = "".join(stream.push(p.encode()) for p in ["Hello </", "en", "d> tail"])
    assert out == "Hello " and stream.stopped


def test_partial_stop_is_released_when_it_turns_out_not_to_be_one() -> None:
    stream = TextStream(["STOP"])
    out = stream.push(b"ST") + stream.push(b"ART") + stream.finish()
    assert out == "START" and not stream.stopped


def test_utf8_split_across_tokens_streams_intact() -> None:
    stream = TextStream()
    parts = [stream.push(b) for b in (b"caf", b"\xc3", b"\xa9", b"!")]
    assert parts == ["caf", "", "é", "!"]


# --- n-gram drafter ---


def guess(drafter: Drafter, abort: Callable[[], bool] | None = None) -> int | None:
    """The drafter's next guess, greedy (None: none, or `abort` stopped it)."""
    grown = grow(drafter, SamplingParams(), np.random.default_rng(0), abort)
    return grown.guess if grown is not None else None


def guesses(drafter: NgramDrafter, n: int) -> list[int]:
    out = []
    for _ in range(n):
        token = guess(drafter)
        if token is None:
            break
        out.append(token)
    return out


def test_the_ngram_drafter_copies_what_followed_the_longest_match_guess_by_guess() -> None:
    drafter = NgramDrafter()
    tokens = [7, 1, 2, 3, 4, 5, 9, 8, 2, 3, 6, 0, 1, 2, 3]  # (1 2 3) agrees longer than (8 2 3)
    assert drafter.catch_up(tokens) == len(tokens)
    assert guesses(drafter, 3) == [4, 5, 9] and drafter.local == [*tokens, 4, 5, 9]


def test_the_ngram_drafter_keeps_guesses_lead_confirms_and_drops_the_rest() -> None:
    drafter = NgramDrafter()
    tokens = [1, 2, 3, 4, 5, 1, 2, 3]
    drafter.catch_up(tokens)
    assert guesses(drafter, 2) == [4, 5]
    assert drafter.catch_up([*tokens, 4]) == 0 and drafter.local == [*tokens, 4, 5]
    assert drafter.catch_up([*tokens, 6]) == 1 and drafter.local == [*tokens, 6]
    assert guesses(drafter, 1) == []  # (2 3 6) occurred nowhere before


def test_the_ngram_drafter_has_nothing_to_copy_without_a_match() -> None:
    drafter = NgramDrafter()
    drafter.catch_up([1, 2, 3, 4])
    assert guesses(drafter, 4) == [] and drafter.local == [1, 2, 3, 4]


# --- model drafter ---


def test_model_drafter_hands_out_a_guess_before_evaluating_it() -> None:
    model = FakeModel()
    drafter = ModelDrafter(model)
    context = model.tokenize("hello there")
    drafter.catch_up(context)
    evaluated = model.evaluated
    first = guess(drafter)
    assert first == model.greedy_continuation(context, 1)[0]
    assert model.evaluated == evaluated  # ready without a draft step: lead sees it sooner
    assert drafter.local == [*context, first]
    second = guess(drafter)
    assert model.evaluated == evaluated + 1  # the first guess is evaluated now
    assert [first, second] == model.greedy_continuation(context, 2)
    assert drafter.catch_up([*context, first]) == 0  # lead took the guess: nothing to redo
    other = (first % 10) + 1
    drafter.catch_up([*context, other])  # lead emitted something else: start over from it
    assert drafter.local == [*context, other]
    third = guess(drafter)
    assert third == model.greedy_continuation([*context, other], 1)[0]


def test_an_aborted_draft_step_keeps_its_guess_pending() -> None:
    model = FakeModel()
    drafter = ModelDrafter(model)
    context = model.tokenize("hello there")
    drafter.catch_up(context)
    first = guess(drafter)
    assert guess(drafter, lambda: True) is None
    assert model.cached == context and drafter.local == [*context, first]
    second = guess(drafter)
    assert [first, second] == model.greedy_continuation(context, 2)


# --- sampling ---


def test_distribution_truncates_exactly() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], dtype=np.float32))
    top_p = distribution(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert top_p.token_ids.tolist() == [0, 1]
    assert np.allclose(top_p.probs, [0.5 / 0.8, 0.3 / 0.8])
    top_k = distribution(logits, SamplingParams(temperature=1.0, top_k=3))
    assert top_k.token_ids.tolist() == [0, 1, 2]
    min_p = distribution(logits, SamplingParams(temperature=1.0, min_p=0.25))
    assert min_p.token_ids.tolist() == [0, 1, 2]


def test_greedy_distribution_and_seeded_sampling() -> None:
    logits = np.array([0.1, 3.0, 0.2], dtype=np.float32)
    assert sample(distribution(logits, SamplingParams()), np.random.default_rng()) == 1
    dist = distribution(logits, SamplingParams(temperature=1.0))

    def draws(seed: int, n: int) -> list[int]:
        rng = np.random.default_rng(seed)
        return [sample(dist, rng) for _ in range(n)]

    assert draws(7, 50) == draws(7, 50)  # one seed, one sequence of draws
    assert draws(7, 50) != draws(8, 50)  # another seed, another sequence
    shares = np.bincount(draws(7, 4000), minlength=3) / 4000
    assert np.allclose(shares, dist.dense(3), atol=0.02)  # about 5 %, 90 %, 5 %


def test_top_p_window_falls_back_to_full_sort_when_mass_is_spread() -> None:
    logits = np.zeros(5000, dtype=np.float32)  # flat: the top window holds too little mass
    dist = distribution(logits, SamplingParams(temperature=1.0, top_p=0.9001))
    assert dist.token_ids.size == 4501  # smallest prefix reaching 0.9001


# --- settings / CLI ---


def test_cli_flags_override_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAD_PORT", "6000")
    monkeypatch.setenv("LEAD_MAX_DRAFT", "5")
    s = parse_settings(LeadSettings, "lead", "", ["--port", "7000", "-m", "x.gguf"])
    assert (s.port, s.max_draft, s.model) == (7000, 5, "x.gguf")


def test_cli_bad_value_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(LeadSettings, "lead", "", ["--port", "99999"])
    assert exc.value.code == 2
    assert "port" in capsys.readouterr().err


@pytest.mark.parametrize(("choice", "ngl", "slots", "on"), [
    ("auto", 0, 1, False), ("auto", -1, 1, True), ("auto", 20, 1, True), ("auto", 0, 4, True),
    ("on", 0, 1, True), ("off", -1, 4, False)])
def test_flash_attention_is_on_where_layers_are_offloaded_or_slots_share_the_cache(
        choice: str, ngl: int, slots: int, on: bool) -> None:
    from shared.model import flash_attention

    assert flash_attention(choice, ngl, slots) is on

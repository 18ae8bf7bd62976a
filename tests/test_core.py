"""Pure pieces: draft board, cost model, text stream, drafters, sampling, CLI."""

from __future__ import annotations

import numpy as np
import pytest

from back.drafter import ModelDrafter
from back.ngram import ngram_draft
from lead.cost import CostModel, draft_outcome
from lead.drafts import BackRegistry, Candidate, DraftBoard
from lead.settings import LeadSettings
from lead.textstream import TextStream
from shared.cli import parse_settings
from shared.fake import FakeModel
from shared.protocol import SamplingParams
from shared.sampling import distribution, sample

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
    assert reg.active(60.0, now=70.0) == 1


# --- cost model ---


def believing(alpha: float, **kw: int) -> CostModel:
    """A cost model whose prior acceptance is `alpha` (weight 100)."""
    return CostModel(max_draft=kw.pop("max_draft", 8), prior=(100 * alpha, 100 * (1 - alpha)),
                     **kw)


def test_cost_model_switches_speculation_off_where_verify_is_expensive() -> None:
    cpu = believing(0.5)
    for b in range(1, 10):
        cpu.record_step(b, 0.05 * b)  # verify cost linear in b (compute-bound CPU)
    assert cpu.choose() == 0


def test_cost_model_drafts_long_where_verify_is_flat() -> None:
    gpu = believing(0.9)
    for b in range(1, 10):
        gpu.record_step(b, 0.02)  # flat cost: memory-bound GPU
    assert gpu.choose() >= 6


def test_draft_outcome_counts_matches_until_the_first_miss() -> None:
    assert draft_outcome([1, 2, 3], [1, 2, 9, 4]) == (2, True)
    assert draft_outcome([1, 2], [1, 2, 3]) == (2, False)  # the draft ran out
    assert draft_outcome([1, 2, 3], [1]) == (1, False)  # lead emitted one token
    assert draft_outcome([5], [1]) == (0, True)


def test_cost_model_learns_acceptance_from_unverified_drafts() -> None:
    model = CostModel(max_draft=4, probe_first=8, probe_every=8, probe_outcomes=2)
    for b in (1, 2, 3):
        model.record_step(b, 0.05 * (1 + (b - 1) / 2))  # b=2 1.5x, b=3 2x
    for _ in range(30):
        model.record_outcome(0, True)  # drafts on offer were wrong at their first token
    assert model.alpha < 0.25 and model.choose() == 0
    asked = []
    for step in range(21):
        model.record_step(1, 0.05)
        asked.append(model.wanted())
        if asked[-1] and step % 3 == 0:  # a draft on offer at every third probe step
            model.record_outcome(0, True)
    # 8 quiet steps after speculation stopped, a probe asks until 2 drafts were compared
    # (at loop steps 9 and 12), then lead is quiet for 8 steps again.
    assert asked[:7] == [0] * 7 and asked[7:13] == [1] * 6
    assert asked[13:20] == [0] * 7 and asked[20] == 1
    for _ in range(30):  # plain steps whose offered draft proved right: no verify paid
        model.record_outcome(1, False)
    assert model.alpha > 0.9 and model.choose() >= 2 and model.wanted() >= 2


def _probe_pattern(model: CostModel, steps: int, outcome: tuple[int, bool] | None,
                   busy: bool = False) -> str:
    """wanted() after each plain step, as a string; `outcome` is recorded whenever a
    draft is wanted (None: no back ever offers one); `busy`: steps taken while it drafts
    (at the quiet price)."""
    asked = ""
    for _ in range(steps):
        model.record_step(1, model.plain() if model.plain_s else 0.05,
                          busy=busy and asked[-1:] not in ("", "0"))
        asked += str(model.wanted())
        if outcome is not None and asked[-1] != "0":
            model.record_outcome(*outcome)
    return asked


def test_probes_back_off_while_nothing_pays_and_end_without_outcomes() -> None:
    model = CostModel(max_draft=4, probe_first=2, probe_every=8, probe_steps=3)
    model.record_step(1, 0.05)
    model.record_step(2, 0.1)  # b=2 costs 2x: nothing pays without evidence of acceptance
    for _ in range(20):
        model.record_outcome(0, True)
    # No back ever offers a draft: each probe ends after 3 steps, and the quiet gap
    # doubles from 2 steps (one of them the b=2 step) to at most 8.
    assert _probe_pattern(model, 40, None) == \
        "0" + "111" + "0" * 4 + "111" + "0" * 8 + "111" + "0" * 8 + "111" + "0" * 7


def test_the_first_probe_comes_early_again_after_speculation_ran() -> None:
    model = CostModel(max_draft=4, probe_first=2, probe_every=8, probe_outcomes=2)
    model.record_step(1, 0.05)
    model.record_step(2, 0.075)  # b=2 costs 1.5x
    # drafts miss: probes of 2 outcomes, gaps growing to 8 steps (7 after the probe's)
    assert "11" + "0" * 7 + "11" in _probe_pattern(model, 60, (0, True))
    for _ in range(10):
        model.record_outcome(3, False)  # then drafts are right: lead speculates
    assert _probe_pattern(model, 3, None) == "222"  # k = 2 pays
    for _ in range(3):
        model.record_outcome(0, True)  # and wrong again: speculation stops
    assert _probe_pattern(model, 4, None)[:2] == "01"  # a probe on the second quiet step


def test_cost_model_follows_a_change_of_prompt_within_a_few_steps() -> None:
    model = CostModel(max_draft=8)
    for _ in range(50):
        model.record_outcome(8, False)  # a code reply: whole drafts right
    assert model.alpha > 0.95
    for _ in range(3):
        model.record_outcome(1, True)  # then prose: a miss after one match, every step
    assert model.alpha < 0.7
    for _ in range(3):
        model.record_outcome(0, True)  # then only misses
    assert model.alpha < 0.35
    for _ in range(3):
        model.record_outcome(8, False)  # and code again
    assert model.alpha > 0.8


def test_a_replys_first_token_is_estimated_apart() -> None:
    model = believing(0.97)
    for b in range(1, 10):
        model.record_step(b, 0.05 * (1 + (b - 1) / 2))  # b=2 1.5x, b=3 2x, ...
    assert model.choose() >= 2  # mid-reply, drafts pay
    # a reply's first token: no evidence yet, so nothing is verified, but a draft is
    # still asked for, so that lead learns how often it is right
    assert model.choose(first=True) == 0 and model.wanted(first=True) == 1
    for _ in range(5):
        model.record_outcome(0, True, first=True)  # chat replies: the first guess misses
    assert model.alpha_first < 0.2 and model.alpha > 0.95  # mid-reply estimate untouched
    assert model.choose(first=True) == 0 and model.choose() >= 2
    for _ in range(10):
        model.record_outcome(4, False, first=True)  # completions: first guesses right
    assert model.alpha_first > 0.8 and model.choose(first=True) >= 2


def test_cost_model_explores_batch_sizes_one_at_a_time() -> None:
    model = believing(0.95)
    assert model.choose() == 1  # only b=1 priced: try b=2 first, not b=9
    model.record_step(1, 0.05)
    model.record_step(2, 0.05)
    assert model.choose() == 2


def calibrated(alpha: float, shape: dict[int, float], **kw: int) -> CostModel:
    """A model that believes `alpha`, with quiet prices 0.1 s x shape."""
    model = believing(alpha, **kw)
    model.calibrate({b: 0.1 * x for b, x in shape.items()})
    return model


# measured on a 2-core Xeon (one thread): b=4 is cheaper than b=3
XEON = {1: 1.0, 2: 1.64, 3: 2.09, 4: 1.56, 5: 2.21, 6: 2.71, 7: 3.09, 8: 3.02, 9: 3.37}


def test_a_calibrated_model_verifies_the_paying_length_without_exploring() -> None:
    model = calibrated(0.86, XEON)
    assert model.choose() == 3  # b=4, found at once: no step spent at b=2 or b=3
    assert model.choose(available=2) == 2  # where only 2 draft tokens are on offer


def test_a_short_draft_is_padded_to_a_cheaper_larger_batch() -> None:
    model = calibrated(0.68, XEON)
    assert [model.batch_for(b) for b in (1, 2, 3, 4, 5)] == [1, 4, 4, 4, 5]
    # 2 draft tokens: 2.14 tokens expected, for 1.56x at b=4 padded (2.09x at b=3)
    assert model.choose(available=2) == 2
    flat = calibrated(0.68, {1: 1.0, 2: 1.02, 3: 1.01, 4: 1.03})  # a GPU: noise, not gain
    assert [flat.batch_for(b) for b in (2, 3)] == [2, 3]


def test_a_drafting_backs_slowdown_switches_speculation_off() -> None:
    model = calibrated(0.96, {1: 1.0, 2: 1.8, 3: 2.6, 4: 3.4, 5: 4.2})
    assert model.choose() >= 2  # quiet prices: 2.88 tokens for 2.6x at k=2
    for _ in range(10):
        model.record_step(1, 0.12, busy=True)  # plain steps 1.2x slower while it drafts
    assert model.slowdown > 1.15 and model.choose() == 0
    assert model.plain() == pytest.approx(0.1)  # plain decoding is priced quiet


def test_one_slow_step_does_not_price_a_length_out_for_good() -> None:
    model = calibrated(0.9, XEON, probe_first=2, probe_every=8, probe_outcomes=2)
    model.record_step(4, 0.1 * 1.56 * 6.5, busy=True)  # one b=4 step 6.5x its quiet price
    assert model.choose() == 0
    asked = _probe_pattern(model, 20, None, busy=True)  # probes: the back drafts again
    # the probe measured the back's slowdown afresh: normal steps brought the price back
    assert "3" in asked and model.choose() == 3


def test_where_not_even_perfect_drafts_pay_backs_are_never_asked() -> None:
    model = calibrated(0.99, {b: float(b) for b in range(1, 10)})  # cost linear in b
    assert not model.could_pay(1.0) and "not even perfect drafts" in model.describe()
    assert model.wanted(first=True) == 0  # not even for a reply's first token
    assert _probe_pattern(model, 100, (8, False)) == "0" * 100  # and no probes


def _prose_step(model: CostModel, slow: float) -> str:
    """One plain step of a reply the draft gets wrong; a back drafts whenever lead asks, and
    steps taken while it drafts cost `slow` times their quiet price. H: backs are hushed."""
    drafting = model.wanted() > 0
    model.record_step(1, 0.1 * (slow if drafting else 1.0), busy=drafting)
    if drafting:
        model.record_outcome(0, True)
    return "H" if model.hush else "p" if model.probing else "."


# measured on a 2-core AMD EPYC (AVX-512), one thread: perfect drafts pay only quiet
EPYC = {1: 1.0, 2: 1.84, 3: 2.57, 4: 3.25, 5: 4.04, 6: 4.8, 7: 5.6, 8: 8.25, 9: 8.9}


def test_a_back_that_slows_lead_so_much_drafts_cannot_pay_is_hushed_until_it_stops() -> None:
    model = calibrated(0.3, EPYC, probe_first=2, probe_every=8, probe_outcomes=2)
    assert model.could_pay(1.0) and model.choose() == 0 and not model.hush
    slowed = "".join(_prose_step(model, 1.5) for _ in range(200))
    assert slowed[-100:].count("H") >= 95  # probes grow rare: 2 steps in 64, then 128
    assert model.hush and model.wanted(first=True) == 0  # not even a reply's first token
    # the back moves to a core of its own: its next probe finds no slowdown
    freed = "".join(_prose_step(model, 1.0) for _ in range(300))
    assert freed[-100:].count("H") == 0 and "p" in freed[-100:]  # probed again


def test_a_back_whose_perfect_drafts_would_still_pay_is_not_hushed() -> None:
    model = calibrated(0.3, XEON, probe_first=2, probe_every=8, probe_outcomes=2)
    slowed = "".join(_prose_step(model, 1.5) for _ in range(200))
    assert model.could_pay(model.slowdown) and "H" not in slowed  # probes go on


def test_cost_model_fixed_and_available() -> None:
    assert CostModel(max_draft=8, fixed=3).choose() == 3
    assert CostModel(max_draft=8, fixed=3).choose(available=2) == 2
    assert CostModel(max_draft=8, fixed=3).wanted() == 3


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


def test_ngram_proposes_continuation_of_latest_longest_match() -> None:
    tokens = [1, 2, 3, 4, 5, 9, 1, 2, 3]
    assert ngram_draft(tokens, n_max=3, k=2) == [4, 5]


def test_ngram_prefers_longer_match_and_handles_no_match() -> None:
    tokens = [7, 8, 1, 2, 5, 6, 2, 9, 1, 2]  # "1 2" -> 5 ; "2" alone -> 9 (latest)
    assert ngram_draft(tokens, n_max=2, k=1) == [5]
    assert ngram_draft([1, 2, 3], n_max=3, k=4) == []
    assert ngram_draft([1, 2, 1], n_max=3, k=0) == []


# --- sampling ---


def test_model_drafter_hands_out_a_guess_before_evaluating_it() -> None:
    model = FakeModel()
    drafter = ModelDrafter(model)
    context = model.tokenize("hello there")
    drafter.catch_up(context)
    evaluated = model.evaluated
    guess, _ = drafter.next_token(SamplingParams(), np.random.default_rng(0)) or (None, None)
    assert guess == model.greedy_continuation(context, 1)[0]
    assert model.evaluated == evaluated  # ready without a draft step: lead sees it sooner
    assert drafter.local == [*context, guess]
    second, _ = drafter.next_token(SamplingParams(), np.random.default_rng(0)) or (None, None)
    assert model.evaluated == evaluated + 1  # the first guess is evaluated now
    assert [guess, second] == model.greedy_continuation(context, 2)
    assert drafter.catch_up([*context, guess]) == 0  # lead took the guess: nothing to redo
    other = (guess % 10) + 1
    drafter.catch_up([*context, other])  # lead emitted something else: start over from it
    assert drafter.local == [*context, other]
    third, _ = drafter.next_token(SamplingParams(), np.random.default_rng(0)) or (None, None)
    assert third == model.greedy_continuation([*context, other], 1)[0]


def test_an_aborted_draft_step_keeps_its_guess_pending() -> None:
    model = FakeModel()
    drafter = ModelDrafter(model)
    context = model.tokenize("hello there")
    drafter.catch_up(context)
    guess, _ = drafter.next_token(SamplingParams(), np.random.default_rng(0)) or (None, None)
    assert drafter.next_token(SamplingParams(), np.random.default_rng(0), lambda: True) is None
    assert model.cached == context and drafter.local == [*context, guess]
    second, _ = drafter.next_token(SamplingParams(), np.random.default_rng(0)) or (None, None)
    assert [guess, second] == model.greedy_continuation(context, 2)


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
    params = SamplingParams(temperature=1.0)
    draws = [[sample(distribution(logits, params), np.random.default_rng(7)) for _ in range(5)]
             for _ in range(2)]
    assert draws[0] == draws[1]


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


def test_rate_limiter_allows_rate_then_refuses_then_refills() -> None:
    from lead.drafts import RateLimiter

    limiter = RateLimiter(rate=5)
    allowed = [limiter.allow("a", now=0.0) for _ in range(8)]
    assert allowed == [True] * 5 + [False] * 3
    assert limiter.allow("b", now=0.0)  # per client
    assert limiter.allow("a", now=0.5)  # half a second refills 2.5 posts

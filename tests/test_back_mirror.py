"""LeadMirror: the back's copy of lead's state, fed states by hand (no network, no threads)."""

from __future__ import annotations

from back.mirror import LeadMirror
from shared.wire.protocol import State, grammar_id


def live(version: int, tokens: list[int], offset: int = 0, n_tokens: int | None = None,
         session: str = "s", draft_len: int = 2, **extra: object) -> State:
    n = offset + len(tokens) if n_tokens is None else n_tokens
    return State(version=version, lead_id="L", session_id=session, offset=offset,
                 token_ids=tokens, n_tokens=n, done=False, draft_len=draft_len,
                 **extra)  # type: ignore[arg-type]


def attached(**kw: object) -> LeadMirror:
    return LeadMirror(**kw)  # type: ignore[arg-type]


def test_tokens_are_spliced_from_the_offset_lead_sends_them_from() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2, 3]))
    mirror.take(live(2, [4, 5], offset=3))
    assert mirror.tokens == (1, 2, 3, 4, 5) and mirror.following
    mirror.take(live(3, [9], offset=4))  # lead re-sent from 4: what it says there stands
    assert mirror.tokens == (1, 2, 3, 4, 9)


def test_a_state_older_than_one_taken_is_refused() -> None:
    mirror = attached()
    assert mirror.take(live(3, [1, 2, 3]))
    assert not mirror.take(live(2, [7]))
    assert mirror.state.version == 3 and mirror.tokens == (1, 2, 3)


def test_a_state_starting_past_the_backs_tokens_is_not_spliced() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2, 3]))
    assert not mirror.take(live(2, [9], offset=5))  # a gap: tokens 3 and 4 never came
    assert mirror.tokens == (1, 2, 3) and mirror.state.version == 1
    assert mirror.take(live(2, [4, 5, 6], offset=3))
    assert mirror.tokens == (1, 2, 3, 4, 5, 6) and mirror.should_draft()


def test_a_new_session_starts_from_no_tokens() -> None:
    mirror = attached()
    assert mirror.take(live(1, [1, 2, 3])) and mirror.take(live(2, [4], offset=3))
    assert not mirror.take(live(3, [8, 9], offset=4, session="t"))  # not from its start
    assert mirror.state.session_id == "s" and mirror.tokens == (1, 2, 3, 4)
    assert mirror.take(live(3, [7, 7, 7, 8, 9], session="t"))
    assert mirror.state.session_id == "t" and mirror.tokens == (7, 7, 7, 8, 9)


def test_following_and_drafting_need_a_live_session_held_whole() -> None:
    mirror = attached()
    assert not mirror.following  # no session yet
    mirror.take(live(1, [1, 2], n_tokens=3))  # lead holds more than it sent
    assert not mirror.following
    mirror.take(live(2, [1, 2, 3]))
    assert mirror.following and mirror.should_draft() and not mirror.should_draft(sit_out=True)
    mirror.take(live(3, [], offset=3, draft_len=0))  # lead wants no drafts now
    assert mirror.following and not mirror.should_draft()
    mirror.take(live(4, [], offset=3).model_copy(update={"done": True}))
    assert not mirror.following and not mirror.should_draft()


def test_the_session_to_poll_quietly_is_one_this_back_does_not_draft_for() -> None:
    mirror = attached()
    assert mirror.quiet() == ""  # no session: any news will do
    mirror.take(live(1, [1, 2, 3]))
    assert mirror.quiet() == ""  # drafting: every step's news matters
    assert mirror.quiet(sit_out=True) == "s"
    mirror.take(live(2, [], offset=3, draft_len=0))
    assert mirror.quiet() == "s"
    mirror.take(live(3, [], offset=3).model_copy(update={"done": True}))
    assert mirror.quiet(sit_out=True) == ""  # over: wake for the next


def test_a_session_longer_than_the_draft_model_holds_is_sat_out() -> None:
    mirror = attached(fits=lambda n: n < 4)
    mirror.take(live(1, [1, 2, 3]))
    assert not mirror.outgrew() and mirror.should_draft()
    mirror.take(live(2, [4], offset=3))
    assert mirror.outgrew()  # said once...
    mirror.take(live(3, [5], offset=4))
    assert not mirror.outgrew()  # ...not at every state
    assert not mirror.following and not mirror.should_draft() and mirror.quiet() == "s"
    mirror.take(live(4, [1], session="short"))
    assert mirror.should_draft()  # the next session that fits is drafted for


def test_a_draft_continues_lead_only_on_the_path_lead_took() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2, 3]))
    assert mirror.draft_past((1, 2, 3, 4, 5)) == [4, 5]
    assert mirror.draft_past([1, 2, 3]) == []
    assert mirror.draft_past((1, 2)) is None  # does not hold lead's tokens yet
    mirror.take(live(2, [6], offset=3))  # lead took 6 where the draft said 4
    assert mirror.draft_past((1, 2, 3, 4, 5)) is None  # 5 continued a token lead rejected


def test_nothing_is_a_draft_past_lead_unless_a_live_session_is_followed() -> None:
    mirror = attached()
    assert mirror.draft_past((1, 2, 3)) is None  # no session: no tokens to continue
    mirror.take(live(1, [1, 2, 3]))
    mirror.take(live(2, [8, 9], session="t"))  # the next session
    assert mirror.tokens == (8, 9) and mirror.draft_past((1, 2, 3, 4)) is None
    assert mirror.draft_past((8, 9, 5)) == [5]
    mirror.take(live(4, [], offset=2, session="t").model_copy(update={"done": True}))
    assert mirror.draft_past((8, 9, 5)) is None  # over: a post would be stale


GBNF = 'root ::= "yes" | "no"'


def test_a_named_grammar_is_drafted_under_only_once_its_text_is_held() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2, 3], grammar_id=grammar_id(GBNF)))
    assert mirror.following and not mirror.should_draft()  # the text is not here yet
    assert mirror.missing_grammar() == grammar_id(GBNF)
    mirror.hold_grammar(grammar_id(GBNF), GBNF)
    assert mirror.should_draft() and mirror.state.sampling.grammar == GBNF
    mirror.take(live(2, [4], offset=3, grammar_id=grammar_id(GBNF)))  # later states: no text
    assert mirror.state.sampling.grammar == GBNF and mirror.missing_grammar() is None
    mirror.take(live(3, [1, 2], session="t", grammar_id=grammar_id(GBNF)))
    assert mirror.should_draft()  # another session, the same grammar: held already
    mirror.take(live(4, [5], session="u"))
    assert mirror.state.sampling.grammar is None  # a free reply


def test_a_lead_that_sends_the_text_in_every_state_is_still_followed() -> None:
    mirror = attached()
    old = State.model_validate({**live(1, [1, 2]).model_dump(), "grammar": GBNF})
    mirror.take(old)
    assert mirror.missing_grammar() is None and mirror.should_draft()
    assert mirror.state.sampling.grammar == GBNF


def test_a_session_whose_grammar_cannot_be_had_is_sat_out() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2], grammar_id="0123456789abcdef"))
    mirror.skipped = "s"
    assert mirror.missing_grammar() is None and not mirror.following
    assert mirror.quiet() == "s"  # polled quietly: no request per token

"""LeadMirror: the back's copy of lead's state, fed states by hand (no network, no threads)."""

from __future__ import annotations

from back.mirror import LeadMirror, parted
from shared.protocol import State, grammar_id


def live(version: int, tokens: list[int], offset: int = 0, n_tokens: int | None = None,
         session: str = "s", draft_len: int = 2, **extra: object) -> State:
    n = offset + len(tokens) if n_tokens is None else n_tokens
    return State(version=version, lead_id="L", session_id=session, offset=offset,
                 token_ids=tokens, n_tokens=n, done=False, draft_len=draft_len,
                 **extra)  # type: ignore[arg-type]


def attached(**kw: object) -> LeadMirror:
    mirror = LeadMirror(**kw)  # type: ignore[arg-type]
    mirror.attach("L")
    return mirror


def test_tokens_are_spliced_from_the_offset_lead_sends_them_from() -> None:
    mirror = attached()
    mirror.take(live(1, [1, 2, 3]))
    mirror.take(live(2, [4, 5], offset=3))
    assert mirror.tokens == (1, 2, 3, 4, 5) and mirror.following
    mirror.take(live(3, [9], offset=4))  # lead re-sent from 4: what it says there stands
    assert mirror.tokens == (1, 2, 3, 4, 9)


def test_a_state_older_than_one_taken_is_refused() -> None:
    mirror = attached()
    assert mirror.take(live(3, [1, 2, 3])) is not None
    assert mirror.take(live(2, [7])) is None  # e.g. a watch reply that lost to a post's
    assert mirror.state.version == 3 and mirror.tokens == (1, 2, 3)


def test_only_another_lead_id_means_lead_restarted() -> None:
    mirror = attached()
    mirror.take(live(5, [1]))
    assert not mirror.other_lead(State(version=2, lead_id="L"))  # lower: just stale
    assert mirror.other_lead(State(version=9, lead_id="M"))
    mirror.attach("M")  # the handshake with the new lead: its versions start over
    assert mirror.take(State(version=0, lead_id="M")) is not None and mirror.tokens == ()


def test_a_state_starting_past_the_backs_tokens_is_refetched_not_spliced() -> None:
    # e.g. a post's reply that lands after a reconnect reset the back's copy of lead's tokens
    mirror = attached()
    mirror.take(live(1, [1, 2, 3]))
    taken = mirror.take(live(2, [9], offset=5))
    assert taken is not None and taken.refetch
    assert mirror.tokens == (1, 2, 3)
    assert not mirror.following and not mirror.should_draft()  # nothing drafted on a gap
    assert mirror.state.version == -1  # so the watch asks again, from offset 3
    assert mirror.take(State(version=1, session_id="older", done=False)) is None  # late
    assert mirror.state.session_id == "s" and mirror.tokens == (1, 2, 3)
    mirror.take(live(2, [4, 5, 6], offset=3))
    assert mirror.tokens == (1, 2, 3, 4, 5, 6) and mirror.should_draft()


def test_a_new_session_starts_from_no_tokens() -> None:
    mirror = attached()
    first = mirror.take(live(1, [1, 2, 3]))
    assert first is not None and first.new_session
    same = mirror.take(live(2, [4], offset=3))
    assert same is not None and not same.new_session
    # the next session's tokens, sent from the offset the back asked for: a gap
    other = mirror.take(live(3, [8, 9], offset=4, session="t"))
    assert other is not None and other.new_session and other.refetch
    assert mirror.tokens == () and mirror.state.session_id == "t"
    again = mirror.take(live(3, [7, 7, 7, 8, 9], session="t"))
    assert again is not None and not again.new_session and mirror.tokens == (7, 7, 7, 8, 9)


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
    first = mirror.take(live(1, [1, 2, 3]))
    assert first is not None and not first.outgrew and mirror.should_draft()
    grown = mirror.take(live(2, [4], offset=3))
    assert grown is not None and grown.outgrew  # said once...
    again = mirror.take(live(3, [5], offset=4))
    assert again is not None and not again.outgrew  # ...not at every state
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


def test_parted_compares_where_both_have_tokens() -> None:
    assert not parted((1, 2, 3), (1, 2))
    assert not parted([1, 2], (1, 2, 3))
    assert parted((1, 2, 4), (1, 2, 3))
    assert not parted((), (1,))


def test_nothing_is_a_draft_past_lead_unless_a_live_session_is_followed() -> None:
    mirror = attached()
    assert mirror.draft_past((1, 2, 3)) is None  # no session: no tokens to continue
    mirror.take(live(1, [1, 2, 3]))
    mirror.take(live(2, [8, 9], offset=4, session="t"))  # the next session: a gap
    assert mirror.tokens == () and mirror.draft_past((1, 2, 3, 4)) is None
    mirror.take(live(3, [8, 9], session="t"))
    assert mirror.draft_past((8, 9, 5)) == [5]
    mirror.take(live(4, [], offset=2, session="t").model_copy(update={"done": True}))
    assert mirror.draft_past((8, 9, 5)) is None  # over: a post would be stale


def test_a_state_from_a_lead_no_longer_followed_is_not_taken() -> None:
    # e.g. a post's reply from the old lead, landing after the handshake with its successor
    mirror = attached()
    mirror.take(live(40, [1, 2, 3]))
    mirror.attach("M")
    assert mirror.take(live(41, [1, 2, 3, 4])) is None  # lead_id "L"
    assert mirror.state.version == -1 and mirror.tokens == ()
    taken = mirror.take(State(version=2, lead_id="M", session_id="m", token_ids=[5],
                              n_tokens=1, done=False, draft_len=2))
    assert taken is not None and mirror.tokens == (5,) and mirror.should_draft()


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

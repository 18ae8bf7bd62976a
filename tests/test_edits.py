"""Lead's own drafts following a copy under way past each change (lead/drafts/edits.py):
a file echoed back with a rename, an insertion, a change not made again; the copy's odds."""

from __future__ import annotations

import numpy as np
import pytest

from lead.drafts.copier import FOLLOWED, MATCHED
from lead.drafts.edits import ANCHOR, CONFIRM, Follow, moved
from lead.drafts.own import OWN, OwnDrafts, SessionCopies
from lead.policy.scoreboard import Offer, Scoreboard
from shared.ngram import NgramIndex

NAME = 7  # a name the source uses three times
NEW = (8, 9)  # what the reply renames it to


def source_with_name() -> list[int]:
    """Distinct tokens (no accidental matches) with NAME at 30, 70 and 110."""
    body = [int(t) for t in np.random.default_rng(1).permutation(np.arange(100, 1100))[:140]]
    for at in (30, 70, 110):
        body[at] = NAME
    return body


def renamed(body: list[int], keep: int = 0) -> list[int]:
    """`body` with NAME renamed to NEW, but where it occurs past the `keep`-th time."""
    out, seen = [], 0
    for t in body:
        seen += t == NAME
        out.extend(NEW if t == NAME and not (keep and seen > keep) else (t,))
    return out


def proposals(kind: SessionCopies, prompt: list[int], reply: list[int], most: int = 16
              ) -> list[tuple[int, ...]]:
    """The kind's copy at each token of `reply` emitted one at a time."""
    out = []
    for i in range(len(reply)):
        match, _ = kind.copy("s", [*prompt, *reply[:i]], most)
        out.append(match.token_ids if match is not None else ())
    return out


def right_from(copies: list[tuple[int, ...]], reply: list[int], at: int) -> int:
    """How many leading tokens of the copy proposed at `at` the reply then emitted."""
    n = 0
    for guess, token in zip(copies[at], reply[at:], strict=False):
        if guess != token:
            break
        n += 1
    return n


def test_a_rename_learned_at_its_first_use_is_drafted_at_every_later_one() -> None:
    body = source_with_name()
    prompt, reply = [1, *body, 2], renamed(body)
    copies = proposals(SessionCopies(), prompt, reply)
    first, second, third = (reply.index(8, at) for at in (0, 40, 80))
    assert right_from(copies, reply, first) == 0  # the first use: no way to know it
    # ten tokens before each later use, the copy drafts through the new name and on
    assert right_from(copies, reply, second - 10) == 16
    assert right_from(copies, reply, third - 10) == 16
    # a plain lookup copies the old name there: the index alone cannot know the change
    index = NgramIndex()
    index.sync([*prompt, *reply[:second - 10]])
    lookup = index.lookup(16)
    assert lookup is not None and NAME in lookup.token_ids


def test_past_an_insertion_the_copy_resumes_at_the_first_token_that_agrees_again() -> None:
    body = source_with_name()
    at = 50
    reply = [*body[:at], 901, 902, 903, *body[at:]]  # three new tokens, then the copy again
    copies = proposals(SessionCopies(), [1, *body, 2], reply)
    # one token of the source past the new ones is enough: a KEY-token lookup needs three
    assert copies[at + 4][:8] == tuple(body[at + 1:at + 9])
    index = NgramIndex()
    index.sync([1, *body, 2, *reply[:at + 4]])
    assert index.lookup(8) is None


def test_a_change_not_made_again_is_forgotten_and_the_copy_goes_on() -> None:
    body = source_with_name()
    prompt, reply = [1, *body, 2], renamed(body, keep=1)  # only the first use renamed
    kind = SessionCopies()
    copies = proposals(kind, prompt, reply)
    second = len(renamed(body[:70]))  # where the old name stays
    assert right_from(copies, reply, second - 5) == 5  # the change drafted, wrongly
    assert kind.follows["s"].changes == {}  # then forgotten
    third = second + 40  # the next use: copied as it stands
    assert right_from(copies, reply, third - 10) == 16


def test_a_short_anchor_that_turns_out_wrong_keeps_where_the_reply_left_the_copy() -> None:
    tokens = list(range(100, 160))  # source: 100 .. 159, copied from 0 into 60 ..
    seq = [*tokens, *tokens[:20]]
    f = Follow(len(seq), 20, ANCHOR)
    seq += [500, 120]  # left at 20; then a token of the source just past: resumed there
    moved(f, seq)
    assert f.left is None and f.src == 21 and f.trial is not None
    seq += [501]  # it was not the copy again
    moved(f, seq)
    assert f.left == (80, 20)  # the reply's place and the source's where it left first
    seq += tokens[20:20 + CONFIRM + 1]  # the copy resumes where it was left
    moved(f, seq)
    assert f.left is None and f.src == 20 + CONFIRM + 1 and f.trial is None


def test_the_copy_followed_is_priced_by_p_accept_of_its_own_learned_from_its_outcomes() -> None:
    body = source_with_name()
    own, scores, key = OwnDrafts(longest=8), Scoreboard(), f"{OWN}:ngram"
    assert isinstance(own.kinds["ngram"], SessionCopies)
    prompt = [1, *body, 2]
    early = own.propose("s", [*prompt, *body[:5]])["ngram"]  # a 5-token match: not followed
    assert early.scale is MATCHED and early.known[0] == 5
    tokens = [*prompt, *body[:20]]
    followed = own.propose("s", tokens)["ngram"]  # 20 tokens: a copy under way
    assert followed.scale is FOLLOWED and followed.known[0] == 20
    before = scores.known_p_accept(key, (20,), FOLLOWED)[0]
    scores.offered("s", tokens, False, {key: Offer(followed.token_ids, followed.known,
                                                   FOLLOWED, back=False)})
    scores.settle("s", [*prompt, *body[:30]], final=True)  # lead emitted the 8 drafted
    assert scores.known_p_accept(key, (20,), FOLLOWED)[0] > before
    assert scores.known_p_accept(key, (5,), MATCHED)[0] == pytest.approx(dict(MATCHED.priors)[3])

"""Where the back's branches go, which slot holds which, and which one lead took (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from back.branching import (
    Growing,
    Pick,
    Sprout,
    assign,
    branch_sites,
    rejection_probs,
    taken_by_lead,
)
from back.posts import on_wire
from shared.branch import Branch
from shared.wire.protocol import SamplingParams

LEAD = (1, 2, 3)
DRAFT = (10, 11, 12, 13)
LOCAL = LEAD + DRAFT


def picks(*probs: float) -> dict[int, Pick]:
    """The draft's guesses past LEAD, each picked with this probability, each with a
    runner-up (its token + 50)."""
    return {len(LEAD) + i: Pick(DRAFT[i], None, DRAFT[i] + 50, p) for i, p in enumerate(probs)}


def test_rejection_probs_are_reaching_a_guess_times_missing_it() -> None:
    p_reject = rejection_probs(picks(0.5, 0.9, 0.2, 1.0), LOCAL, len(LEAD))
    assert p_reject == pytest.approx({3: 0.5, 4: 0.5 * 0.1, 5: 0.5 * 0.9 * 0.8, 6: 0.0})
    assert branch_sites(picks(0.5, 0.9, 0.2, 1.0), LOCAL, len(LEAD), 2) == [3, 5]


def test_p_accept_stop_at_a_guess_that_is_not_this_drafter_s() -> None:
    mixed = picks(0.5, 0.5, 0.5, 0.5)
    mixed[5] = Pick(99, None, 60, 0.5)  # redrafted since: local holds another token there
    assert set(rejection_probs(mixed, LOCAL, len(LEAD))) == {3, 4}
    no_runner_up = picks(0.5, 0.5)
    no_runner_up[3] = Pick(DRAFT[0], None, None, 0.5)
    assert set(rejection_probs(no_runner_up, LOCAL, len(LEAD))) == {4}


def growing(pos: int, tokens: list[int]) -> Growing:
    return Growing(pos, LOCAL[:pos + 1], tokens, [None] * len(tokens), SamplingParams())


def test_slots_keep_branches_at_kept_sites_and_free_the_rest() -> None:
    held = {0: growing(3, [60]), 1: growing(5, [62])}
    dropped, opened = assign([3, 4, 6], held, 3)
    assert dropped == [1] and opened == [(1, 4), (2, 6)]
    dropped, opened = assign([3, 4, 5, 6], held, 2)  # two slots: no more than that
    assert dropped == [] and opened == []
    dropped, opened = assign([], held, 2)
    assert sorted(dropped) == [0, 1] and opened == []


def test_lead_took_the_branch_whose_root_it_emitted() -> None:
    held = {0: growing(4, [61, 70, 71]), 1: growing(5, [62, 72])}
    assert taken_by_lead(held, LOCAL, LEAD + (10, 61)) == 0
    assert taken_by_lead(held, LOCAL, LEAD + (10, 61, 70, 71, 5)) == 0  # and past its end
    assert taken_by_lead(held, LOCAL, LEAD + (10, 61, 99)) is None  # then left it
    assert taken_by_lead(held, LOCAL, LEAD + (10, 11, 62)) == 1
    assert taken_by_lead(held, LOCAL, LEAD + (10, 11, 63)) is None
    assert taken_by_lead(held, LOCAL, LEAD + (10,)) is None  # not reached yet


def test_branches_hang_off_the_draft_they_were_grown_on() -> None:
    mine = Sprout(LOCAL[:5], Branch(4, (61, 70)))
    assert [b.at for b in on_wire(len(LEAD), DRAFT, [mine], False)] == [1]
    assert on_wire(len(LEAD), DRAFT[:1], [mine], False) == []  # the draft ends before its site
    assert on_wire(len(LEAD), (10, 99, 12), [mine], False) == []  # another guess at its site
    assert np.isclose(growing(4, [61]).path[-1], 61) and growing(4, [61]).path[:4] == list(
        LOCAL[:4])

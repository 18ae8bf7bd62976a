"""Backoff: the back's waits between attempts to reach lead, and its outage count."""

from __future__ import annotations

from back.backoff import Backoff


def test_waits_double_up_to_a_cap_and_an_outage_is_counted_once() -> None:
    backoff = Backoff(first=0.25, most=1.0)
    assert backoff.reached(0.0) is None  # up from the start: no outage
    assert backoff.failed(10.0) == (True, 0.25)
    assert [backoff.failed(t) for t in (11.0, 12.0, 13.0)] == \
        [(False, 0.5), (False, 1.0), (False, 1.0)]
    assert backoff.outages == 1
    assert backoff.reached(14.5) == 4.5  # down since the first failure
    backoff.steady = True  # and a state of lead's was taken (else: a flap, waited out longer)
    assert backoff.failed(20.0) == (True, 0.25)  # a new outage starts over
    assert backoff.outages == 2

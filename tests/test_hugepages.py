"""When lead and back start again asking glibc for transparent huge pages (pure)."""

from __future__ import annotations

from shared.hugepages import TUNABLE, wanted, with_tunable, without_tunable

MADVISE = "always [madvise] never\n"


def test_a_restart_is_wanted_only_where_huge_pages_come_on_request_alone() -> None:
    assert wanted({}, MADVISE)
    assert not wanted({}, "[always] madvise never\n")  # the kernel gives them anyway
    assert not wanted({}, "always madvise [never]\n")  # nor ever
    assert not wanted({}, None)  # not glibc on Linux
    assert not wanted({"GLIBC_TUNABLES": TUNABLE}, MADVISE)  # restarted already: no loop
    assert not wanted({"DUO_HUGE_PAGES": "0"}, MADVISE)  # told not to


def test_the_tunable_joins_others_and_leaves_them_when_taken_out() -> None:
    env = with_tunable({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{TUNABLE}" and env["X"] == "1"
    assert with_tunable({})["GLIBC_TUNABLES"] == TUNABLE
    assert without_tunable(env) == "glibc.malloc.arena_max=2"
    assert without_tunable({}) == ""

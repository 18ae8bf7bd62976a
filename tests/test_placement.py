"""Where lead and back run on a shared host: pure choices, the CLI, and real processes."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from back.settings import BackSettings
from lead.server.settings import LeadSettings
from shared.cli import parse_settings
from shared.placement import (
    LeadPlace,
    PlacementError,
    choose_back,
    choose_lead,
    format_cpus,
    parse_cpus,
)

FOUR = frozenset(range(4))


def test_cpu_lists_parse_and_print_back() -> None:
    assert parse_cpus("0-3,6") == {0, 1, 2, 3, 6}
    assert format_cpus({6, 0, 1, 2, 3}) == "0-3,6"
    assert format_cpus(parse_cpus("1,3-5,7")) == "1,3-5,7"


@pytest.mark.parametrize("text", ["", "a", "3-1", "1-", "-2", "1,,2", "0-3 x"])
def test_a_bad_cpu_list_is_a_clear_error(text: str) -> None:
    with pytest.raises(PlacementError, match="not a CPU list"):
        parse_cpus(text)


@pytest.mark.parametrize("cls", [LeadSettings, BackSettings])
def test_a_bad_cpus_flag_is_a_one_line_cli_error(cls: type, capsys: pytest.CaptureFixture
                                                 ) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(cls, "prog", "", ["--cpus", "3-1"])
    assert exit_.value.code == 2
    assert "cpus" in capsys.readouterr().err


def test_lead_runs_one_thread_per_cpu_it_may_use() -> None:
    everything = choose_lead("all", 0, FOUR)
    assert everything.cpus is None and everything.threads == 4
    pinned = choose_lead("0-1", 0, FOUR)
    assert pinned.cpus == {0, 1} and pinned.threads == 2
    assert choose_lead("0-1", 3, FOUR).threads == 3  # the user's count stands
    fewer = choose_lead("all", 2, FOUR)  # --threads 2 of 4 CPUs: two CPUs, two for backs
    assert fewer.cpus == {0, 1} and fewer.threads == 2
    on_gpu = choose_lead("all", 0, FOUR, on_gpu=True)  # --n-gpu-layers -1
    assert on_gpu.cpus == {0} and on_gpu.threads == 1
    back = choose_back("auto", 0, FOUR, "h", LeadPlace("h", on_gpu.cpus, on_gpu.threads))
    assert back.cpus == {1, 2, 3} and not back.sit_out  # a CPU back beside a GPU lead drafts
    assert choose_lead("0-1", 0, FOUR, on_gpu=True).cpus == {0, 1}  # --cpus still wins
    with pytest.raises(PlacementError, match="not available"):
        choose_lead("2-5", 0, FOUR)


def test_a_back_beside_lead_takes_the_cpus_lead_leaves() -> None:
    lead = LeadPlace("host-a", frozenset({0, 1}), 2)
    back = choose_back("auto", 0, FOUR, "host-a", lead)
    assert back.cpus == {2, 3} and back.threads == 2 and not back.sit_out and back.beside_lead
    assert not back.cpus & lead.cpus


def test_a_back_beside_a_lead_on_every_cpu_sits_out() -> None:
    back = choose_back("auto", 0, FOUR, "host-a", LeadPlace("host-a", FOUR, 4))
    assert back.sit_out
    assert "--cpus" in back.describe()  # it says how to give the back cores


def test_a_back_on_another_host_uses_every_cpu_it_has() -> None:
    back = choose_back("auto", 0, FOUR, "host-b", LeadPlace("host-a", FOUR, 4))
    assert back.cpus is None and back.threads == 4 and not back.sit_out
    old_lead = choose_back("auto", 0, FOUR, "host-b", None)  # a lead that says nothing
    assert old_lead.threads == 4 and not old_lead.sit_out


def test_a_back_told_where_to_run_runs_there_and_still_knows_it_is_beside_lead() -> None:
    lead = LeadPlace("host-a", FOUR, 4)
    told = choose_back("2-3", 1, FOUR, "host-a", lead)
    assert told.cpus == {2, 3} and told.beside_lead and not told.sit_out
    assert choose_back("all", 0, FOUR, "host-a", lead).cpus is None
    assert not choose_back("2-3", 1, FOUR, "host-b", lead).beside_lead
    with pytest.raises(PlacementError):
        choose_back("7", 0, FOUR, "host-a", lead)


def _thread_cpus_and_policies(pid: int) -> tuple[set[str], set[int]]:
    cpus, policies = set(), set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        cpus.add(re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1))  # type: ignore
        policies.add(os.sched_getscheduler(int(tid)))
    return cpus, policies


@pytest.mark.real
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_real_back_started_with_default_flags_keeps_off_leads_cpus() -> None:
    from bench.procs import Back, Lead, wait_until

    first = min(os.sched_getaffinity(0))
    lead = Lead("smollm2-135m", "--threads", "0", "--cpus", str(first))
    back = Back(lead, "smollm2-135m", "--threads", "0")  # what a user types: no placement
    try:
        back.wait_attached()
        wait_until(lambda: "placement:" in back.log(), 30, "the back's placement line")
        cpus, policies = _thread_cpus_and_policies(back.p.pid)
        assert str(first) not in ",".join(cpus).split(",") and len(cpus) == 1, cpus
        assert policies == {os.SCHED_OTHER}
    finally:
        back.stop()
        lead.stop()


@pytest.mark.real
def test_real_back_beside_a_lead_on_every_cpu_sits_out_and_computes_nothing() -> None:
    import httpx

    from bench.procs import Back, Lead, metric, wait_until

    lead = Lead("smollm2-135m", "--threads", "0")
    back = Back(lead, "smollm2-135m", "--threads", "0")
    try:
        back.wait_attached()
        wait_until(lambda: "placement: sitting out" in back.log(), 30, "the placement line")
        _, policies = _thread_cpus_and_policies(back.p.pid)
        assert policies == {os.SCHED_IDLE}  # for what little it still does
        reply = httpx.post(f"{lead.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Count to ten."}], "max_tokens": 24})
        assert reply.status_code == 200 and reply.json()["usage"]["drafted_tokens"] == 0
        wait_until(lambda: "caught up" in back.log(), 30, "the back's session line")
        assert "caught up 0 tokens" in back.log()  # it took in nothing: no model work
        assert metric(lead, "duo_draft_posts_total") == 0
    finally:
        back.stop()
        lead.stop()

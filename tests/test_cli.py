"""The CLI made from a settings class: its help, and the values it refuses."""

from __future__ import annotations

import re

import pytest
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from back.settings import BackSettings
from lead.server.settings import LeadSettings
from shared.cli import build_parser, parse_settings
from shared.rpc import RpcSettings


def flag_helps(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """Each flag's help as `--help` prints it, on one line."""
    text = " ".join(build_parser(settings_cls, "prog", "").format_help().split())
    text = text.partition("-h, --help show this help message and exit")[2]  # (past usage)
    flag = r"(--[a-z][a-z-]*)(?:, --?[a-z][a-z_-]*)*(?: [A-Z_]+)?"  # (then its other names)
    return dict(re.findall(flag + r" (.*?\[env \w+\])", text))

@pytest.mark.parametrize("settings_cls", [BackSettings, LeadSettings, RpcSettings])
def test_help_gives_each_flags_default_once(settings_cls: type[BaseSettings]) -> None:
    helps = flag_helps(settings_cls)
    assert sorted(helps) == sorted(f"--{name.replace('_', '-')}"
                                   for name in settings_cls.model_fields)
    for flag, text in helps.items():
        assert text.count("(default:") <= 1, f"{flag}: {text}"
        assert "(default: )" not in text and "(default: None)" not in text, f"{flag}: {text}"

def test_help_shows_a_default_the_description_gives_in_its_place() -> None:
    back, lead = flag_helps(BackSettings), flag_helps(LeadSettings)
    assert "(default: host-pid)" in back["--back-id"]
    assert "(default: cost-aware, measured)" in lead["--draft-len"]
    assert "(default: 16)" in back["--max-ahead"] and "(default: True)" in back["--send-dists"]

class Percent(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="P_")
    share: float = Field(0.5, description="share of the CPUs, in % (e.g. 50 %)")

def test_a_percent_sign_in_a_description_does_not_break_help() -> None:
    assert "in % (e.g. 50 %) (default: 0.5)" in flag_helps(Percent)["--share"]

@pytest.mark.parametrize("address", ["ftp://lead:5555", "lead:port", ":5555", "lead:99999"])
def test_a_lead_address_no_retry_can_reach_is_refused_at_startup(address: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(BackSettings, "back", "", ["--lead", address])
    assert exit_.value.code == 2

@pytest.mark.parametrize("address", ["lead:5555", "127.0.0.1:5555", "https://duo.example/",
                                     "http://[::1]:5555"])
def test_lead_addresses_are_taken_as_given(address: str) -> None:
    assert parse_settings(BackSettings, "back", "", ["--lead", address]).lead == address

@pytest.mark.parametrize("value", ["1", "100", "1023", str((1 << 20) + 1)])
def test_a_memory_too_small_to_anchor_a_reply_or_too_large_is_refused(value: str) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse_settings(LeadSettings, "lead", "", ["--ngram-memory", value])
    assert exit_.value.code == 2

@pytest.mark.parametrize("value", [0, 1024, 65536])
def test_no_memory_or_enough_is_taken(value: int) -> None:
    assert parse_settings(LeadSettings, "lead", "", ["--ngram-memory", str(value)]
                          ).ngram_memory == value


@pytest.mark.parametrize(("argv", "said"), [
    (["--tree", "4"], ("--tree: lead-side trees were removed", "chains")),
    (["--tree=0"], ("--tree: lead-side trees were removed", "chains")),
    (["--max-poll-s", "5"], ("--max-poll-s: gone, with the long-polls", "/duo/link")),
    (["--max-poll-s=0"], ("--max-poll-s: gone, with the long-polls", "/duo/link"))])
def test_a_removed_flag_is_a_one_line_error_saying_why(
        argv: list[str], said: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    from lead.__main__ import main
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and len(err.strip().splitlines()) == 1
    assert all(words in err for words in said)

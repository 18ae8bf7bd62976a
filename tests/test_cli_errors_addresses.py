"""Lead addresses and API keys no request could carry: refused by the back, lead and chat
at startup in one line, before any connection; and the back's --cpus, checked as lead's."""

from __future__ import annotations

import httpx
import pytest

from back import __main__ as back_entry
from back.client import LeadClient
from back.settings import BackSettings
from chat.__main__ import parse as chat_parse
from lead.server.settings import LeadSettings
from shared.cli import parse_settings
from shared.placement import allowed_cpus
from shared.wire.httpclient import check_lead

NOT_ADDRESSES = [":::", "ftp://x:1", "127.0.0.1:99999", "http://127.0.0.1:5600?x=1",
                 "127.0.0.1:5600?x=1", "http://h:1/#f", "http://h:1/duo", "h h:1", ""]
BAD_KEYS = ["ключ", "a\nb", "a b", "tab\there", "\x7f"]


@pytest.mark.parametrize("address", NOT_ADDRESSES)
def test_an_address_no_request_could_reach_is_refused_naming_it(address: str) -> None:
    with pytest.raises(ValueError, match="not a lead address") as refused:
        check_lead(address)
    assert repr(address) in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("address", "url"), [
    ("127.0.0.1", "http://127.0.0.1:5555"), ("lead", "http://lead:5555"),  # lead's port
    ("[::1]", "http://[::1]:5555"), ("lead:6000", "http://lead:6000"),
    ("http://lead:6000/", "http://lead:6000"), ("https://duo.example", "https://duo.example"),
    ("lead:80", "http://lead:80"), ("[::1]:80", "http://[::1]:80")])  # http's own port
def test_a_host_alone_is_lead_at_its_default_port(address: str, url: str) -> None:
    assert check_lead(address) == url
    asked = httpx.URL(LeadClient(address).base_url.rstrip("/"))
    assert asked == httpx.URL(url)  # the back asks there (httpx drops http's own :80)


@pytest.mark.parametrize("address", NOT_ADDRESSES)
def test_the_back_and_chat_refuse_such_an_address_in_one_line(
        address: str, capsys: pytest.CaptureFixture[str]) -> None:
    for parse in (lambda: parse_settings(BackSettings, "python -m back", "",
                                         ["--lead", address]),
                  lambda: chat_parse(["--lead", address])):
        with pytest.raises(SystemExit) as exit_:
            parse()
        assert exit_.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert "error:" in last and "not a lead address" in last, last


@pytest.mark.parametrize("key", BAD_KEYS)
def test_a_key_no_header_can_carry_is_refused_in_one_line(
        key: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    for settings_cls in (BackSettings, LeadSettings):
        with pytest.raises(SystemExit) as exit_:
            parse_settings(settings_cls, "prog", "", ["--api-key", key])
        assert exit_.value.code == 2
    with pytest.raises(SystemExit):
        chat_parse(["--api-key", key])
    monkeypatch.setenv("DUO_API_KEY", key)
    with pytest.raises(SystemExit):
        chat_parse([])
    said = capsys.readouterr().err
    assert said.count("printable ASCII") == 4
    assert key not in said  # a key is not echoed


def test_keys_a_header_carries_are_taken() -> None:
    key = "sk-A1_b2.c3~d4+e5/f6="
    assert parse_settings(BackSettings, "back", "", ["--api-key", key]).api_key == key
    assert parse_settings(LeadSettings, "lead", "", ["--api-key", ""]).api_key is None
    assert chat_parse(["--api-key", key]).api_key == key


def never_followed(_worker: object) -> None:
    raise AssertionError("the back went on to follow lead")


def test_back_cpus_it_may_not_use_are_a_one_line_error_at_startup(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(back_entry, "run_worker", never_followed)
    missing = str(max(allowed_cpus()) + 1)
    with pytest.raises(SystemExit) as exit_:
        back_entry.main(["--drafter", "ngram", "--cpus", missing])
    assert exit_.value.code == 1
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and said[0].startswith(
        f"error: --cpus {missing}: CPUs {missing} are not available to this process"), said

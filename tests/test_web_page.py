"""Lead's web page in a real headless Chromium (Debian's, driven by Playwright).

Against a simulated lead and back (real processes, python -m bench.sim): a reply's
highlighted tokens equal its accepted_tokens, the live panel lists the back, Stop ends the
generation on lead, a wrong key is an error, the page works at phone width and from the
keyboard. Any console error fails the test. Screenshots go to test-artifacts/web/.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.procs import ROOT, SIM_TARGET, SimBack, SimLead, metric, wait_until

pytestmark = pytest.mark.process

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"no browser: {CHROMIUM} is missing (apt-get install chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[web]')")
expect = sync_api.expect
expect.set_options(timeout=10_000)  # ms: a loaded 2-core CI machine runs lead, back and Chromium
ARTIFACTS = ROOT / "test-artifacts" / "web"
REPLY_S = 30_000  # ms: a reply of the simulated target takes a few seconds


class Console:
    """Console errors and uncaught exceptions of a page; `allow` names expected ones."""

    def __init__(self, page: sync_api.Page) -> None:
        self.errors: list[str] = []
        self.allowed: list[str] = []
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))

    def allow(self, pattern: str) -> None:
        self.allowed.append(pattern)

    def unexpected(self) -> list[str]:
        return [e for e in self.errors if not any(re.search(p, e) for p in self.allowed)]


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[SimLead, str]]:
    """A simulated lead with one simulated back attached, and the back's id."""
    lead = SimLead()
    back = SimBack(lead)
    try:
        back.wait_attached()
        match = re.search(r"following lead at \S+ as (\S+)", back.log())
        assert match, back.log()
        yield lead, match.group(1)
    finally:
        back.stop()
        lead.stop()


@pytest.fixture(scope="module")
def keyed_lead() -> Iterator[SimLead]:
    lead = SimLead(None, *SIM_TARGET, "--api-key", "right")
    yield lead
    lead.stop()


@pytest.fixture
def page(browser: sync_api.Browser, request: pytest.FixtureRequest
         ) -> Iterator[tuple[sync_api.Page, Console]]:
    """A page in a fresh context; closed before any lead stops (its live stream would hold
    lead's shutdown), after a screenshot and a check of its console."""
    size = getattr(request, "param", {"width": 1280, "height": 800})
    context = browser.new_context(viewport=size)
    page = context.new_page()
    console = Console(page)
    yield page, console
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{request.node.name}.png"), full_page=True)
    context.close()
    assert console.unexpected() == [], "console errors"


def ask(page: sync_api.Page, prompt: str) -> sync_api.Locator:
    """Type a prompt and send it with Enter; the reply's element."""
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    return page.locator("article.assistant").last


def test_highlighted_tokens_equal_accepted_tokens_and_the_panel_lists_the_back(
        page: tuple[sync_api.Page, Console], sim: tuple[SimLead, str]) -> None:
    p, _ = page
    lead, back_id = sim
    accepted_before = metric(lead, "duo_accepted_tokens_total")
    p.goto(lead.url)
    expect(p.locator(f'#backs tr[data-back="{back_id}"]')).to_contain_text("127.0.0.1")
    reply = ask(p, "hello there")
    expect(reply).to_have_attribute("data-finish", "length", timeout=REPLY_S)
    marks = reply.locator("mark.drafted")
    accepted = int(reply.get_attribute("data-usage-accepted") or -1)  # the stream's usage
    # each mark is a run of a draft's tokens (a step's are sent as one event)
    highlighted = sum(marks.evaluate_all("ms => ms.map(m => Number(m.dataset.tokens))"))
    assert accepted > 0 and highlighted == accepted and 0 < marks.count() < accepted
    assert metric(lead, "duo_accepted_tokens_total") - accepted_before == accepted  # lead's count
    assert set(marks.evaluate_all("ms => ms.map(m => m.title)")) == {f"drafted by {back_id}"}
    assert reply.locator(".foot").inner_text().startswith(
        f"{reply.get_attribute('data-usage-tokens')} tokens · {accepted} from drafts")
    total = int(metric(lead, "duo_accepted_tokens_total"))  # this back drafted them all
    row = p.locator(f'#backs tr[data-back="{back_id}"]')
    expect(row.locator("td").nth(2)).to_have_text(re.compile(rf"^{total} / \d+$"))
    expect(p.locator("#replies circle").first).to_be_visible()  # the reply is plotted
    expect(p.locator("#prices rect").first).to_be_visible()  # and the verify prices
    first_turn = sum(int(reply.get_attribute(f"data-usage-{k}") or 0) for k in ("prompt", "tokens"))
    second = ask(p, "and again")  # the conversation goes with it (`reply` is now this one)
    expect(second).to_have_attribute("data-finish", "length", timeout=REPLY_S)
    assert int(second.get_attribute("data-usage-prompt") or 0) > first_turn


def test_stop_ends_the_generation_on_lead(page: tuple[sync_api.Page, Console],
                                          sim: tuple[SimLead, str]) -> None:
    p, _ = page
    lead, _ = sim
    generated_before = metric(lead, "duo_generated_tokens_total")
    p.goto(lead.url)
    p.click("details.settings summary")
    p.fill("#max_tokens", "1500")
    reply = ask(p, "a long reply please")
    expect(reply.locator(".text")).to_have_text(re.compile(r"[\s\S]{30}"), timeout=REPLY_S)
    p.click("#stop")
    expect(reply).to_have_attribute("data-finish", "stopped")
    # lead counts a reply's tokens before it reports not busy
    wait_until(lambda: not httpx.get(f"{lead.url}/health").json()["busy"], 5, "lead to be free")
    assert metric(lead, "duo_generated_tokens_total") - generated_before < 1500
    expect(p.locator("#send")).to_be_enabled()
    expect(p.locator("#stop")).to_be_disabled()


def test_a_wrong_key_is_an_error_and_the_right_one_works(page: tuple[sync_api.Page, Console],
                                                          keyed_lead: SimLead) -> None:
    p, console = page
    p.goto(keyed_lead.url)
    expect(p.locator("#key-form")).to_be_visible()
    console.allow(r"status of 401")  # the browser logs the refused request itself
    p.fill("#key-input", "wrong")
    p.press("#key-input", "Enter")
    expect(p.locator("#key-error")).to_contain_text("refused the key")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(ARTIFACTS / "wrong-key.png"))
    p.fill("#key-input", "right")
    p.press("#key-input", "Enter")
    expect(p.locator("#key-form")).to_be_hidden()
    expect(p.locator("#lead-facts")).to_contain_text("draft length")
    reply = ask(p, "hi")
    expect(reply).to_have_attribute("data-finish", re.compile("length|stop"), timeout=REPLY_S)
    assert p.evaluate("sessionStorage.getItem('duo-api-key')") == "right"
    assert len([e for e in console.errors if "401" in e]) >= 1  # the wrong key was tried


def test_a_refused_request_shows_leads_message(page: tuple[sync_api.Page, Console],
                                               sim: tuple[SimLead, str]) -> None:
    p, console = page
    lead, _ = sim
    p.goto(lead.url)
    p.click("details.settings summary")
    p.fill("#max_tokens", "0")  # the page leaves checking to lead
    console.allow(r"status of 400")  # the browser logs the refused request itself
    reply = ask(p, "hello")
    expect(reply).to_have_attribute("data-finish", "error")
    expect(reply.locator(".error")).to_contain_text("lead answered 400: max_tokens")
    expect(p.locator("#send")).to_be_enabled()


@pytest.mark.parametrize("page", [{"width": 390, "height": 844}], indirect=True)
def test_phone_width_and_keyboard_only(page: tuple[sync_api.Page, Console],
                                       sim: tuple[SimLead, str]) -> None:
    p, _ = page
    lead, back_id = sim
    p.goto(lead.url)
    expect(p.locator(f'#backs tr[data-back="{back_id}"]')).to_be_visible()
    p.locator("#prompt").focus()
    p.keyboard.type("line one")
    p.keyboard.press("Shift+Enter")  # a new line, not a send
    p.keyboard.type("line two")
    assert p.input_value("#prompt") == "line one\nline two"
    assert p.locator("article.user").count() == 0
    p.keyboard.press("Enter")
    expect(p.locator("article.assistant").last).to_have_attribute("data-finish", "length",
                                                                  timeout=REPLY_S)
    assert p.evaluate("document.documentElement.scrollWidth <= window.innerWidth")

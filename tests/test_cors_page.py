"""A web page on another origin calling lead from a real browser (Debian's chromium driven
by Playwright; `make browser` installs it): the page is served from a second local port,
and its script fetch()es lead's /v1/chat/completions (a lead process over a scripted
model, tests/scripted_lead.py). Where --cors-origins allows the page's origin it gets the
reply; where not, the browser refuses it (fetch throws) and lead generates nothing; with
--api-key, the preflight passes without the key and the call with it is answered.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_clients import Logged, scripted_lead

pytestmark = pytest.mark.process

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"no browser: {CHROMIUM} is missing (make browser)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api",
                               reason="playwright is not installed (pip install -e '.[web]')")

REPLY = "Hi from lead."
PAGE = b"""<!doctype html><meta charset="utf-8"><title>another origin</title>
<script>
async function ask(lead, key) {
  const headers = {"Content-Type": "application/json"};
  if (key) headers["Authorization"] = "Bearer " + key;
  try {
    const r = await fetch(lead + "/v1/chat/completions", {method: "POST", headers,
      body: JSON.stringify({messages: [{role: "user", content: "hi"}], max_tokens: 20})});
    return {status: r.status, body: await r.json()};
  } catch (e) {
    return {thrown: String(e)};
  }
}
</script>"""


class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(PAGE)))
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page_url() -> Iterator[str]:
    """The page, from a port of its own: another origin than lead's."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM))
        yield browser
        browser.close()


def asked(browser: sync_api.Browser, page_url: str, lead_url: str,
          key: str | None = None) -> dict[str, Any]:
    """What the page's script got from lead."""
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(page_url)
        return page.evaluate("([lead, key]) => ask(lead, key)", [lead_url, key])
    finally:
        context.close()


def page_asks_a_lead(browser: sync_api.Browser, page_url: str, tmp_path: Path,
                     *flags: str) -> tuple[dict[str, Any], list[str], Path]:
    """A scripted lead started with `flags`, asked by the page: what the page got, the
    requests lead logged, and where lead records what was asked of its model."""
    lead = scripted_lead(tmp_path, [("", REPLY)], *flags)
    try:
        logged = Logged(lead.lead)
        got = asked(browser, page_url, lead.url)
        return got, [str(r) for r in logged.requests()], lead.record
    finally:
        lead.lead.stop()


def test_a_page_on_an_origin_lead_allows_gets_the_reply(
        browser: sync_api.Browser, page_url: str, tmp_path: Path) -> None:
    got, requests, _ = page_asks_a_lead(browser, page_url, tmp_path)  # the default: local
    assert got.get("status") == 200, got
    assert got["body"]["choices"][0]["message"]["content"] == REPLY
    assert requests == ["OPTIONS /v1/chat/completions 200", "POST /v1/chat/completions 200"]


def test_a_page_on_an_origin_lead_does_not_allow_is_refused(
        browser: sync_api.Browser, page_url: str, tmp_path: Path) -> None:
    got, requests, record = page_asks_a_lead(browser, page_url, tmp_path,
                                             "--cors-origins", "https://example.com")
    assert "Failed to fetch" in got.get("thrown", ""), got  # the browser refused it
    # its preflight (200 without the page's origin, as llama-server answers): no POST came
    assert requests == ["OPTIONS /v1/chat/completions 200"]
    assert not record.exists()  # nothing was asked of the model


def test_with_a_key_the_preflight_passes_without_it_and_the_call_needs_it(
        browser: sync_api.Browser, page_url: str, tmp_path: Path) -> None:
    lead = scripted_lead(tmp_path, [("", REPLY)], "--api-key", "right")
    try:
        logged = Logged(lead.lead)
        with_key = asked(browser, page_url, lead.url, "right")
        without = asked(browser, page_url, lead.url)
        requests = [str(r) for r in logged.requests()]
    finally:
        lead.lead.stop()
    assert with_key.get("status") == 200, with_key
    assert with_key["body"]["choices"][0]["message"]["content"] == REPLY
    assert without.get("status") == 401, without  # readable by the page: CORS headers on it
    # each call's preflight, sent without the key, passed
    assert requests.count("OPTIONS /v1/chat/completions 200") == 2, requests
    assert "POST /v1/chat/completions 200" in requests
    assert any(r.startswith("POST /v1/chat/completions 401") for r in requests), requests

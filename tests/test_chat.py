"""chat.py driven through a pseudo-terminal (real keystrokes, real output) and through pipes."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import LiveServer, make_settings

pytestmark = pytest.mark.process  # chat.py runs in its own process, lead on a real socket

ROOT = Path(__file__).resolve().parent.parent
GREEN = "\x1b[32m"
ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]|\x1b\][^\x07]*\x07|\r")


def _controlling_tty() -> None:
    """In the child, after setsid: make the pty its terminal, so Ctrl-C sends SIGINT."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """chat.py on a pty: type keys, read the screen's byte stream until a pattern shows."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        master, slave = pty.openpty()
        full_env = {**os.environ, "TERM": "xterm", "PROMPT_TOOLKIT_NO_CPR": "1",
                    "COLUMNS": "120", "LINES": "40", **(env or {})}
        full_env.pop("NO_COLOR", None) if "NO_COLOR" not in (env or {}) else None
        self.p = subprocess.Popen([sys.executable, "chat.py", *args], cwd=ROOT, stdin=slave,
                                  stdout=slave, stderr=slave, env=full_env, close_fds=True,
                                  start_new_session=True, preexec_fn=_controlling_tty)
        os.close(slave)
        self.fd, self.raw = master, ""

    def send(self, keys: str) -> None:
        os.write(self.fd, keys.encode())

    def expect(self, pattern: str, timeout: float = 15.0) -> str:
        """Wait until `pattern` (regex) appears in the plain text after the last match."""
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, ANSI.sub("", self.raw))
            if found:
                return self.raw
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {pattern!r} within {timeout} s; screen:\n"
                                     f"{ANSI.sub('', self.raw)[-1500:]}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if ready:
                try:
                    self.raw += os.read(self.fd, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal: nothing more will come
                    raise AssertionError(f"terminal closed before {pattern!r}; screen:\n"
                                         f"{ANSI.sub('', self.raw)[-1500:]}") from None

    def prompt(self, timeout: float = 15.0) -> None:
        """Wait until the input prompt is live (raw mode on), then forget what was shown.

        Keys typed before prompt_toolkit switches the tty to raw mode would be eaten
        by the line discipline; it enables bracketed paste (ESC[?2004h) when ready."""
        self._wait_raw("\x1b[?2004h", timeout)

    def submitted(self, timeout: float = 15.0) -> None:
        """Wait until the prompt has handed the terminal back (ESC[?2004l): the reply runs."""
        self._wait_raw("\x1b[?2004l", timeout)

    def _wait_raw(self, marker: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.raw:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} within {timeout} s: {self.raw[-500:]!r}")
            ready, _, _ = select.select([self.fd], [], [], min(left, 0.2))
            if ready:
                self.raw += os.read(self.fd, 65536).decode(errors="replace")
        self.raw = self.raw[self.raw.index(marker) + len(marker):]

    def mark(self) -> None:
        """Forget what was shown so far: the next expect looks only at new output."""
        self.raw = ""

    def close(self) -> int:
        if self.p.poll() is None:
            self.p.terminate()
        code = self.p.wait(10)
        os.close(self.fd)
        return code


@pytest.fixture
def lead() -> Iterator[LiveServer]:
    target = FakeModel(cost_s=(0.004, 0.0), eos_bias=-100.0)  # ~250 tok/s, no early EOS
    server = LiveServer(create_app(make_settings(max_tokens=40), target))
    yield server
    server.stop()


def test_streamed_reply_stats_and_new(lead: LiveServer, tmp_path: Path) -> None:
    term = Terminal(["--lead", lead.url], {"XDG_STATE_HOME": str(tmp_path)})
    try:
        term.prompt()
        term.send("hello\r")
        term.expect(r"\[40 tokens, .* tok/s, drafted 0 / accepted 0")
        term.prompt()
        term.send("/new\r")
        term.expect(r"\(new conversation\)")
        term.prompt()
        term.send("/stats\r")
        term.expect(r"backs attached \(last minute\): 0 \| acceptance")
        term.prompt()
        term.send("/help\r")
        term.expect(r"/system TEXT")
        term.prompt()
        term.send("\x04")  # Ctrl-D exits
        assert term.p.wait(10) == 0
    finally:
        term.close()
    assert "hello" in (tmp_path / "duo" / "chat_history").read_text()


def test_multi_line_paste_is_one_message(lead: LiveServer, tmp_path: Path) -> None:
    term = Terminal(["--lead", lead.url, "--max-tokens", "3"], {"XDG_STATE_HOME": str(tmp_path)})
    try:
        term.prompt()
        term.send("\x1b[200~def f():\r    return 1\x1b[201~\r")  # bracketed paste, then Enter
        term.expect(r"\[3 tokens")
    finally:
        term.close()
    history = (tmp_path / "duo" / "chat_history").read_text()
    assert "+def f():\n+    return 1" in history


def test_ctrl_c_stops_the_reply_and_lead(lead: LiveServer, tmp_path: Path) -> None:
    slow = FakeModel(cost_s=(0.05, 0.0), eos_bias=-100.0)  # 20 tok/s: time to interrupt
    server = LiveServer(create_app(make_settings(max_tokens=400), slow))
    term = Terminal(["--lead", server.url], {"XDG_STATE_HOME": str(tmp_path)})
    try:
        term.prompt()
        term.send("tell me a long story\r")
        term.submitted()
        term.expect(r"\w{3}")  # some of the reply streamed
        term.send("\x03")
        term.expect(r"\[stopped\]")
        term.prompt()
        engine = server.server.config.app.state.engine
        deadline = time.monotonic() + 5
        while not (engine.session and engine.session.done) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.session.done and engine.session.finish_reason == "cancelled"
        assert engine.session.n_generated < 400
        term.send("/quit\r")
        assert term.p.wait(10) == 0
    finally:
        term.close()
        server.stop()


@pytest.mark.parametrize(("args", "env", "coloured"), [
    ([], {}, True), (["--no-color"], {}, False), ([], {"NO_COLOR": "1"}, False)])
def test_draft_highlighting_on_and_off(args: list[str], env: dict[str, str], coloured: bool,
                                       tmp_path: Path) -> None:
    target = FakeModel(cost_s=(0.03, 0.0), eos_bias=-100.0)  # slow enough for the feeder
    server = LiveServer(create_app(make_settings(max_tokens=30, draft_len=4), target))
    stop_feeding = _feed_correct_drafts(server, target)
    term = Terminal(["--lead", server.url, *args], {"XDG_STATE_HOME": str(tmp_path), **env})
    try:
        term.prompt()
        term.send("hi\r")
        screen = term.expect(r"accepted [1-9]")
        assert (GREEN in screen) is coloured
    finally:
        stop_feeding()
        term.close()
        server.stop()


def _feed_correct_drafts(server: LiveServer, target: FakeModel):  # type: ignore[no-untyped-def]
    """A stand-in back in a thread: posts the target's own continuation as drafts."""
    import threading

    from tests.test_link import ScriptedLink

    stop = threading.Event()

    def loop() -> None:
        link = ScriptedLink(server.url)
        try:
            while not stop.is_set():
                for s in link.news(timeout=0.5):
                    if not s["done"]:
                        tokens = link.tokens[s["session_id"]]
                        link.post(s["session_id"], len(tokens),
                                  target.greedy_continuation(tokens, 8))
        finally:
            link.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return lambda: (stop.set(), thread.join(5))


def run_piped(args: list[str], stdin: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "chat.py", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60)


def test_piped_mode_prints_just_the_reply(lead: LiveServer) -> None:
    done = run_piped(["--lead", lead.url, "--max-tokens", "12"], "question\n")
    assert done.returncode == 0
    assert len(done.stdout.strip()) > 0 and "tok/s" not in done.stdout and "\x1b" not in done.stdout


def test_a_reader_that_goes_away_ends_it_quietly(lead: LiveServer) -> None:
    """`python chat.py < q | head -c 100`: the pipe closes under the reply."""
    p = subprocess.Popen([sys.executable, "chat.py", "--lead", lead.url], cwd=ROOT,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdin is not None and p.stdout is not None and p.stderr is not None
    p.stdout.close()  # nobody reads: the reply's first write fails
    p.stdin.write(b"question\n")
    p.stdin.close()
    err = p.stderr.read()
    assert p.wait(60) == 141 and err == b"", err


def test_unreachable_lead_is_one_line_error() -> None:
    done = run_piped(["--lead", "127.0.0.1:9"], "hi")
    assert done.returncode == 1
    assert done.stderr.strip().startswith("error: cannot reach lead") and "Traceback" not in \
        done.stderr


def test_wrong_key_and_busy_lead_are_one_line_errors(tmp_path: Path) -> None:
    server = LiveServer(create_app(make_settings(api_key="k"), FakeModel()))
    try:
        done = run_piped(["--lead", server.url, "--api-key", "nope"], "hi")
        assert done.returncode == 1 and "API key" in done.stderr and "Traceback" not in done.stderr
        term = Terminal(["--lead", server.url, "--api-key", "nope"],
                        {"XDG_STATE_HOME": str(tmp_path)})
        try:  # the REPL stays usable after an error
            term.prompt()
            term.send("hi\r")
            term.expect(r"error: lead refused the API key")
            term.prompt()
            term.send("/help\r")
            term.expect(r"/system TEXT")
        finally:
            term.close()
    finally:
        server.stop()


def test_busy_lead_429_is_explained() -> None:
    slow = FakeModel(cost_s=(0.05, 0.0), eos_bias=-100.0)
    server = LiveServer(create_app(make_settings(max_queue=0, max_tokens=200), slow))
    try:
        first = subprocess.Popen([sys.executable, "chat.py", "--lead", server.url], cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        first.stdin.write("a long one\n")
        first.stdin.close()
        engine = server.server.config.app.state.engine
        deadline = time.monotonic() + 10
        while not (engine.session and not engine.session.done) and time.monotonic() < deadline:
            time.sleep(0.02)
        done = run_piped(["--lead", server.url], "me too")
        assert done.returncode == 1 and "busy" in done.stderr
        first.wait(30)
    finally:
        server.stop()

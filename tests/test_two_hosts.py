"""Lead and back on two "hosts": network namespaces joined by a veth pair.

The test makes the namespaces, gives each end an address, runs the simulated lead in
one and the back (and a client) in the other, with an API key, and removes both
namespaces afterwards. Traffic goes only between those two addresses. Skipped, with
the reason, where namespaces cannot be created (needs root and iproute2).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.procs import ROOT, wait_until

pytestmark = pytest.mark.process

TAG = f"{os.getpid() % 100000}"
NS_LEAD, NS_BACK = f"duo-lead-{TAG}", f"duo-back-{TAG}"
LEAD_IP, BACK_IP = "10.199.0.1", "10.199.0.2"
KEY = "two-hosts-key"


def ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True)


@pytest.fixture
def namespaces() -> Iterator[None]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) is not installed")
    made = ip("netns", "add", NS_LEAD)
    if made.returncode != 0:
        pytest.skip(f"cannot create network namespaces here: {made.stderr.strip()}")
    try:
        ip("netns", "add", NS_BACK).check_returncode()
        a, b = f"duoa{TAG}", f"duob{TAG}"
        for cmd in (["link", "add", a, "type", "veth", "peer", "name", b],
                    ["link", "set", a, "netns", NS_LEAD], ["link", "set", b, "netns", NS_BACK],
                    ["-n", NS_LEAD, "addr", "add", f"{LEAD_IP}/30", "dev", a],
                    ["-n", NS_BACK, "addr", "add", f"{BACK_IP}/30", "dev", b],
                    ["-n", NS_LEAD, "link", "set", a, "up"],
                    ["-n", NS_BACK, "link", "set", b, "up"],
                    ["-n", NS_LEAD, "link", "set", "lo", "up"]):
            done = ip(*cmd)
            assert done.returncode == 0, f"ip {' '.join(cmd)}: {done.stderr}"
        yield
    finally:
        ip("netns", "del", NS_BACK)
        ip("netns", "del", NS_LEAD)


def in_ns(ns: str, args: list[str], **kw: object) -> subprocess.Popen[str]:
    return subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, *args], cwd=ROOT,
                            text=True, **kw)  # type: ignore[call-overload]


CLIENT = """
import httpx, json, sys
url, key = sys.argv[1], sys.argv[2]
h = {"Authorization": f"Bearer {key}"}
body = {"messages": [{"role": "user", "content": "across the wire"}], "max_tokens": 60}
print(json.dumps(httpx.post(url + "/v1/chat/completions", json=body, headers=h,
                            timeout=60).json()["usage"]))
"""


def test_lead_and_back_on_two_hosts(namespaces: None, tmp_path) -> None:  # type: ignore[no-untyped-def]
    lead_log, back_log = (tmp_path / "lead.log").open("w"), (tmp_path / "back.log").open("w")
    sim = ["-m", "bench.sim"]
    lead = in_ns(NS_LEAD, [*sim, "lead", "--host", LEAD_IP, "--port", "5555", "--call-s", "0.02",
                           "--api-key", KEY], stdout=lead_log, stderr=subprocess.STDOUT)
    back = in_ns(NS_BACK, [*sim, "back", "--lead", f"{LEAD_IP}:5555", "--agree", "0.9",
                           "--call-s", "0.002", "--api-key", KEY],
                 stdout=back_log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "attached to lead" in (tmp_path / "back.log").read_text()
                   or lead.poll() is not None or back.poll() is not None, 30, "back to attach")
        assert lead.poll() is None and back.poll() is None, (tmp_path / "back.log").read_text()
        client = in_ns(NS_BACK, ["-c", CLIENT, f"http://{LEAD_IP}:5555", KEY],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = client.communicate(timeout=60)
        assert client.returncode == 0, err
        usage = json.loads(out)
        assert usage["completion_tokens"] == 60 and usage["accepted_tokens"] > 0, usage
    finally:
        for proc in (back, lead):
            proc.terminate()
            proc.wait(15)
        lead_log.close()
        back_log.close()

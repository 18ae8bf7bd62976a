"""A GPU backend on every machine: lead and a back on llama.cpp's Vulkan build (`make
vulkan`: .venv-vulkan), over Mesa's software Vulkan driver (lavapipe) where no GPU is.

Lead runs with every layer offloaded and its defaults (startup pricing of batches of 1-65
tokens, flash attention) and serves. Then, its draft length forced, a back on the same
build with none offloaded (it must not touch the GPU) drafts for a streamed reply; the back
is killed mid-reply and another joins and drafts; every emitted token must be the target's
own greedy choice as lead computed it on that backend (its top logprob). Slow on lavapipe
(SmolLM2 at a few tokens a second), so short replies.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from bench.procs import ROOT, Back, Lead
from tests.drafting import FORCED, HELD_PROMPT
from tests.test_real import back_accepted

pytestmark = pytest.mark.real

PYTHON = Path(os.environ.get("DUO_VULKAN_PY", ROOT / ".venv-vulkan" / "bin" / "python"))
# ggml-vulkan skips a CPU-type device (lavapipe) unless it is named
VISIBLE = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"),
           "DUO_LLAMA_LOG": "1"}  # llama.cpp's log: which devices each model uses
DEVICES = ("import json; from shared.llama import ggml; ggml._load_all(); "
           "print(json.dumps(ggml.devices()))")
REPLY = 48  # tokens: enough for a kill and a rejoin on lavapipe's pace


def vulkan_devices() -> list[str]:
    """The Vulkan devices the build sees; skips the tier where there is no build or none."""
    if not PYTHON.is_file():
        pytest.skip(f"no Vulkan build ({PYTHON}): `make vulkan` builds it where Debian's "
                    "Vulkan packages can be installed")
    done = subprocess.run([str(PYTHON), "-c", DEVICES], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, **VISIBLE}, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    found = [name for name, _, _ in json.loads(done.stdout.splitlines()[-1])
             if name.startswith("Vulkan")]
    if not found:
        pytest.skip("the Vulkan build sees no device (mesa-vulkan-drivers not installed?)")
    return found


@pytest.fixture
def default_lead() -> Iterator[Lead]:
    """Lead as a user starts it on a GPU: every layer offloaded, nothing else changed."""
    vulkan_devices()
    proc = Lead("smollm2-135m", "--n-gpu-layers", "-1", sized=False, program=str(PYTHON),
                env=VISIBLE, start_s=900)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def lead() -> Iterator[Lead]:
    """Every layer offloaded, the draft length forced (whether drafts pay on lavapipe is
    this machine's business) and lead's own drafts off: every draft verified is a back's."""
    vulkan_devices()
    proc = Lead("smollm2-135m", "--n-gpu-layers", "-1", *FORCED, sized=False,
                program=str(PYTHON), env=VISIBLE, start_s=900)
    yield proc
    proc.stop()


def stream(lead: Lead, max_tokens: int) -> Iterator[dict]:
    body = {"messages": [{"role": "user", "content": HELD_PROMPT}], "stream": True,
            "max_tokens": max_tokens, "temperature": 0, "logprobs": True, "top_logprobs": 1}
    with httpx.stream("POST", f"{lead.url}/v1/chat/completions", json=body,
                      timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                yield json.loads(line[6:])


def own_choices(events: list[dict]) -> list[tuple[str, str]]:
    """Per emitted token: (the token, lead's top choice where it emitted it)."""
    pairs = []
    for event in events:
        for choice in event.get("choices", []):
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                pairs.append((entry["token"], entry["top_logprobs"][0]["token"]))
    return pairs


def test_lead_with_its_defaults_prices_batches_and_serves(default_lead: Lead) -> None:
    log = default_lead.log()
    assert "using device Vulkan0" in log and "flash attention on" in log
    assert "pricing verify batches of 1-65 tokens" in log and "verify cost over one" in log
    events = list(stream(default_lead, 12))
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    pairs = own_choices(events)
    assert pairs and [t for t, _ in pairs] == [top for _, top in pairs]


def test_a_reply_with_drafts_survives_a_back_killed_and_rejoining(lead: Lead) -> None:
    back = Back(lead, "smollm2-135m", program=str(PYTHON), env=VISIBLE)
    back.wait_attached(120)
    events, killed, rejoined, after = [], None, None, 0
    try:
        for event in stream(lead, REPLY):
            events.append(event)
            accepted = event.get("duo", {}).get("accepted", 0)
            if rejoined is not None:
                after += accepted
            if accepted and killed is None:
                back.kill()  # SIGKILL mid-reply
                killed = len(events)
                rejoined = Back(lead, "smollm2-135m", program=str(PYTHON), env=VISIBLE)
    finally:
        back.stop()
        if rejoined is not None:
            rejoined.stop()
    assert killed is not None, "no draft was accepted before the reply ended"
    assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    pairs = own_choices(events)
    assert len(pairs) >= 10
    assert [t for t, _ in pairs] == [top for _, top in pairs]  # the target's own choices
    # the rejoined back's drafts were accepted in the same reply
    assert rejoined is not None and after > 0 and back_accepted(rejoined) > 0
    # each back kept the GPU out: no device in its log, where lead's names one
    assert "using device" not in back.log() + rejoined.log()
    assert "offloaded 0/" in back.log() and "offloaded 0/" in rejoined.log()

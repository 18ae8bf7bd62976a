"""Real-model tier for llama-server's slot actions (lead/apis/slotactions.py through
shared/llama/state.py's llama.cpp sequence state files): SmolLM2-135M's slot saved, erased,
restored into another slot and into a fresh model (as after a restart), the next request
there evaluating only the prompt's last token and replying as before; a file rewritten
with the plain token list older llama-servers wrote restores too."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lead.server.app import create_app
from shared import slotfile
from shared.llama.model import LlamaModel, load_model
from tests.conftest import make_settings

pytestmark = pytest.mark.real

PROMPT = "Once upon a time, there was a"


def smollm2() -> LlamaModel:
    return load_model("smollm2-135m", threads=1, n_ctx=512, slots=2)


@pytest.fixture(scope="module")
def model() -> LlamaModel:
    return smollm2()


def lead(model: LlamaModel, save_path: Path) -> TestClient:
    return TestClient(create_app(make_settings(slot_save_path=str(save_path), parallel=2,
                                               threads=1, calibrate=False, draft_len=0),
                                 model))


def complete(c: TestClient, slot: int) -> dict[str, Any]:
    r = c.post("/completion", json={"prompt": PROMPT, "id_slot": slot, "n_predict": 12,
                                    "temperature": 0.0, "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()


def act(c: TestClient, slot: int, action: str, filename: str | None = None) -> dict[str, Any]:
    r = c.post(f"/slots/{slot}?action={action}",
               json=None if filename is None else {"filename": filename})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_restored_slot_serves_its_prompt_from_cache_as_before(model: LlamaModel,
                                                                 tmp_path: Path) -> None:
    c = lead(model, tmp_path)
    first = complete(c, 1)
    n_prompt = first["timings"]["prompt_n"]
    assert first["tokens_predicted"] == 12  # a reply to compare, not an EOS at once
    saved = act(c, 1, "save", "slot1.bin")
    assert saved["n_saved"] == first["tokens_cached"] == len(model.slot(1).cached)
    assert saved["n_written"] == (tmp_path / "slot1.bin").stat().st_size
    magic, _, n_words = struct.unpack_from("<III", (tmp_path / "slot1.bin").read_bytes())
    assert magic == slotfile.MAGIC and n_words == saved["n_saved"] + 4  # llama-server's packing
    assert act(c, 1, "erase")["n_erased"] == saved["n_saved"]
    restored = act(c, 0, "restore", "slot1.bin")
    assert (restored["n_restored"], restored["n_read"]) == (saved["n_saved"], saved["n_written"])
    again = complete(c, 0)
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]

    fresh = smollm2()  # another context, as after a restart
    c2 = lead(fresh, tmp_path)
    assert act(c2, 1, "restore", "slot1.bin")["n_restored"] == saved["n_saved"]
    after = complete(c2, 1)
    assert after["timings"]["prompt_n"] == 1 and after["content"] == first["content"]


def test_a_plain_token_list_as_older_servers_wrote_restores(model: LlamaModel,
                                                            tmp_path: Path) -> None:
    c = lead(model, tmp_path)
    first = complete(c, 0)
    act(c, 0, "save", "s.bin")
    path = tmp_path / "s.bin"
    data = path.read_bytes()
    n_words = struct.unpack_from("<I", data, 8)[0]
    tokens = slotfile.unpacked(list(struct.unpack_from(f"<{n_words}i", data, 12)))
    plain = struct.pack(f"<III{len(tokens)}i", *struct.unpack_from("<II", data), len(tokens),
                        *tokens)
    path.write_bytes(plain + data[12 + 4 * n_words:])
    assert act(c, 1, "restore", "s.bin")["n_restored"] == len(tokens)
    again = complete(c, 1)
    assert again["timings"]["prompt_n"] == 1 and again["content"] == first["content"]

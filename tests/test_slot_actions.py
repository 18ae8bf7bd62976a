"""llama-server's slot actions on lead (lead/apis/slotactions.py over lead/decode/slotwork.py),
in process over the fake model: save, erase and restore, the next request in the slot
finding the restored tokens cached; id_slot pinning a request to its slot; an action on a
busy slot waiting for it; llama-server's errors, lead serving on after each. The file
format's pure half (shared/slotfile.py) and the filename check are tested alone."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from bench.fake import FakeModel, VirtualClock
from lead.apis.slotactions import valid_filename
from lead.decode.engine import Engine
from lead.decode.session import GenRequest
from lead.decode.slotwork import save_file
from lead.server.app import create_app
from shared import slotfile
from tests.conftest import async_wait_until, chat_body, make_settings

PROMPT = "what is the capital of france?"


def lead(tmp_path: Path | None, **settings: Any) -> tuple[TestClient, FakeModel]:
    model = FakeModel(slots=2, eos_bias=-100.0)
    path = None if tmp_path is None else str(tmp_path)
    app = create_app(make_settings(slot_save_path=path, parallel=2, max_tokens=12, **settings),
                     model)
    return TestClient(app), model


def complete(c: TestClient, slot: int, prompt: str = PROMPT) -> dict[str, Any]:
    r = c.post("/completion", json={"prompt": prompt, "id_slot": slot, "cache_prompt": True})
    assert r.status_code == 200, r.text
    return r.json()


def act(c: TestClient, slot: int | str, action: str, filename: str | None = None
        ) -> Any:
    body = None if filename is None else {"filename": filename}
    return c.post(f"/slots/{slot}?action={action}", json=body)


def test_a_slot_saved_erased_and_restored_elsewhere_serves_its_prompt_from_cache(
        tmp_path: Path) -> None:
    c, model = lead(tmp_path)
    first = complete(c, 1)
    assert first["timings"]["cache_n"] == 0
    held = list(model.slot(1).cached)
    saved = act(c, 1, "save", "slot1.bin").json()
    assert saved["id_slot"] == 1 and saved["filename"] == "slot1.bin"
    assert saved["n_saved"] == len(held) == first["tokens_cached"]
    assert saved["n_written"] == (tmp_path / "slot1.bin").stat().st_size
    assert saved["timings"]["save_ms"] >= 0
    assert act(c, 1, "erase").json() == {"id_slot": 1, "n_erased": len(held)}
    assert model.slot(1).cached == []
    restored = act(c, 0, "restore", "slot1.bin").json()
    assert restored["n_restored"] == len(held) and restored["n_read"] == saved["n_written"]
    assert model.slot(0).cached == held
    again = complete(c, 0)
    n_prompt = first["tokens_evaluated"]
    assert again["timings"]["cache_n"] == n_prompt - 1 and again["timings"]["prompt_n"] == 1
    assert again["content"] == first["content"]


def test_a_chat_in_the_restored_slot_reports_its_cached_prompt_tokens(tmp_path: Path) -> None:
    c, _ = lead(tmp_path)
    body = chat_body("tell me about paris", id_slot=1, max_tokens=4)
    assert c.post("/v1/chat/completions", json=body).status_code == 200
    assert act(c, 1, "save", "chat.bin").status_code == 200
    assert act(c, 1, "erase").status_code == 200
    assert act(c, 0, "restore", "chat.bin").status_code == 200
    usage = c.post("/v1/chat/completions", json={**body, "id_slot": 0}).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - 1


def test_the_file_is_llama_servers_and_its_plain_token_list_restores_too(
        tmp_path: Path) -> None:
    c, model = lead(tmp_path)
    complete(c, 0)
    act(c, 0, "save", "s.bin")
    held = model.slot(0).cached
    words, state, _ = slotfile.read(str(tmp_path / "s.bin"))
    magic, _, n_words = struct.unpack_from("<III", (tmp_path / "s.bin").read_bytes())
    assert magic == slotfile.MAGIC and n_words == len(held) + 4
    assert words == [-1, slotfile.PACKING, len(held), *held, 0]
    slotfile.write(str(tmp_path / "old.bin"), held, state)  # as servers before packing wrote
    assert act(c, 1, "restore", "old.bin").json()["n_restored"] == len(held)
    assert model.slot(1).cached == held


def test_the_token_packing_round_trips_and_refuses_what_lead_cannot_hold() -> None:
    assert slotfile.unpacked(slotfile.packed([5, 6, 7])) == [5, 6, 7]
    assert slotfile.unpacked(slotfile.packed([])) == []
    assert slotfile.unpacked([5, 6]) == [5, 6]  # a plain list
    assert len(slotfile.packed([5] * 9)) == slotfile.most_words(9)
    with pytest.raises(ValueError, match="mmproj"):
        slotfile.unpacked([-1, slotfile.PACKING, 1, 5, 1, 0])  # one media key
    with pytest.raises(ValueError, match="Truncated"):
        slotfile.unpacked([-1, slotfile.PACKING, 3, 5])


@pytest.mark.parametrize(("name", "ok"), [
    ("slot1.bin", True), ("a b.bin", True), ("ünï.bin", True), (".hidden", True),
    ("", False), (".", False), ("..", False), ("../x.bin", False), ("a/b.bin", False),
    ("a\\b", False), ("x..bin", False), ("x.", False), (" x", False), ("x:y", False),
    ("a\nb", False), ("a\u2215b", False), ("x" * 256, False),
])
def test_filenames_are_judged_as_llama_cpp_judges_them(name: str, ok: bool) -> None:
    assert valid_filename(name) is ok


def test_without_a_save_path_every_action_is_llama_servers_501(tmp_path: Path) -> None:
    c, _ = lead(None)
    for action, name in (("save", "x.bin"), ("restore", "x.bin"), ("erase", None)):
        r = act(c, 0, action, name)
        assert r.status_code == 501, r.text
        error = r.json()["error"]
        assert error["type"] == "not_supported_error"
        assert error["message"] == ("This server does not support slots action. Start it "
                                    "with `--slot-save-path`")
    assert complete(c, 0)["content"]


@pytest.mark.parametrize(("slot", "action", "name", "message"), [
    (0, "save", "../x.bin", "Invalid filename"),
    (0, "save", "a/x.bin", "Invalid filename"),
    (0, "restore", "..", "Invalid filename"),
    (2, "save", "x.bin", "Invalid slot ID"),
    (-1, "erase", None, "Invalid slot ID"),
    ("one", "save", "x.bin", "Invalid slot ID"),
    (0, "wipe", "x.bin", "Invalid action"),
    (0, "restore", "never-saved.bin", "Unable to restore slot: No available space in KV cache "
                                      "or invalid slot save file"),
])
def test_a_bad_action_is_llama_servers_400_and_lead_serves_on(
        tmp_path: Path, slot: int | str, action: str, name: str | None, message: str) -> None:
    c, _ = lead(tmp_path)
    r = act(c, slot, action, name)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert not any(p.name.startswith("x") for p in tmp_path.iterdir())
    assert complete(c, 0)["content"]


def test_a_refused_restore_leaves_the_slot_empty(tmp_path: Path) -> None:
    c, model = lead(tmp_path)
    complete(c, 1)
    (tmp_path / "junk.bin").write_bytes(b"not a state file")
    assert act(c, 1, "restore", "junk.bin").status_code == 400
    assert model.slot(1).cached == []
    assert complete(c, 1)["timings"]["cache_n"] == 0


def test_the_save_folder_is_made_on_first_use_and_one_that_cannot_be_is_a_500(
        tmp_path: Path) -> None:
    c, _ = lead(tmp_path / "new" / "slots")
    assert act(c, 0, "save", "x.bin").status_code == 200
    assert (tmp_path / "new" / "slots" / "x.bin").is_file()
    (tmp_path / "a-file").write_text("")
    c, _ = lead(tmp_path / "a-file")
    r = act(c, 0, "save", "x.bin")
    assert r.status_code == 500 and r.json()["error"]["message"] == "Unable to save slot"
    assert r.json()["error"]["type"] == "server_error"
    assert complete(c, 0)["content"]


def test_id_slot_runs_a_request_in_that_slot_and_past_the_last_wraps_round(
        tmp_path: Path) -> None:
    c, model = lead(tmp_path)
    complete(c, 1, "first prompt")
    assert model.slot(0).cached == [] and model.slot(1).cached[:12] == model.tokenize(
        "first prompt")
    complete(c, 2, "second prompt")  # slot 0, as llama-server's
    assert model.slot(0).cached[:13] == model.tokenize("second prompt")


def test_choices_of_a_request_naming_a_slot_all_come(tmp_path: Path) -> None:
    c, _ = lead(tmp_path)
    body = chat_body("the best book", n=2, max_tokens=4, id_slot=0)
    for _ in range(2):  # llama-server's check that the scheduler is not locked up
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and len(r.json()["choices"]) == 2


def engine_of(model: FakeModel) -> Engine:
    return Engine(model, clock=model.clock or VirtualClock(), parallel=2)


async def reply(engine: Engine, prompt: list[int], slot: int | None, max_tokens: int
                ) -> list[int]:
    req = GenRequest(prompt_ids=prompt, max_tokens=max_tokens, slot=slot)
    async for e in engine.generate(req):
        if e.session is not None:
            return e.session.tokens
    raise AssertionError("no last emission")


def test_an_action_on_a_busy_slot_waits_for_its_generation_to_end(tmp_path: Path) -> None:
    model = FakeModel(slots=2, eos_bias=-100.0, cost_s=(0.002, 0.0), clock=VirtualClock())
    engine = engine_of(model)

    async def body() -> tuple[list[int], int]:
        long = asyncio.create_task(reply(engine, [1, 2, 3, 4], 0, 40))
        await async_wait_until(lambda: engine.session is not None
                               and engine.session.n_generated > 2, what="the reply")
        saved = await engine.on_slot(0, lambda: save_file(model, 0, str(tmp_path / "b.bin")))
        assert long.done()  # the save came after the reply's last step, not during it
        return await long, saved.n_tokens

    tokens, n_saved = asyncio.run(asyncio.wait_for(body(), 60))
    assert n_saved == len(tokens) - 1 == 4 + 40 - 1


def test_a_request_naming_a_busy_slot_waits_for_it_though_another_is_free() -> None:
    model = FakeModel(slots=2, eos_bias=-100.0, cost_s=(0.001, 0.0), clock=VirtualClock())
    engine = engine_of(model)

    async def body() -> list[list[int]]:
        return list(await asyncio.gather(reply(engine, [1, 2, 3], 0, 10),
                                         reply(engine, [7, 8, 9], 0, 10)))

    first, second = asyncio.run(asyncio.wait_for(body(), 60))
    assert model.slot(1).cached == []  # neither took the free slot
    assert model.slot(0).cached == second[:-1]
    assert model.slot(0).cached != first[:-1]

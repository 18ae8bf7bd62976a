"""llama-server's slot actions: POST /slots/ID?action=save|restore (a slot's tokens and
KV cells to a file under --slot-save-path and back, in llama-server's format) and
action=erase, in its words and shapes. The work is the engine's: done between steps once
no generation holds the slot (lead/decode/slotwork.py).
"""

from __future__ import annotations

import json
import os
from functools import partial
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from lead.apis import shapes
from lead.apis.llamaserver import NotServed
from lead.decode.engine import Engine
from lead.decode.slotwork import erase, restore_file, save_file

NO_SAVE_PATH = "This server does not support slots action. Start it with `--slot-save-path`"
# what llama.cpp's fs_validate_filename refuses in a name, beside control characters:
# separators, characters Windows refuses, their look-alikes, BOM and replacement character
FORBIDDEN = set('/\\:*?"<>|') | {"\uff0e", "\u2215", "\u2216", "\ufeff", "\ufffd"}


def slot_actions_router(engine: Engine, save_path: str | None) -> APIRouter:
    """`save_path`: --slot-save-path (None: every action is llama-server's 501)."""
    router = APIRouter()

    @router.post("/slots/{id_slot}")
    async def slot_action(id_slot: str, request: Request, action: str = "") -> dict[str, Any]:
        if save_path is None:
            raise NotServed(NO_SAVE_PATH)
        slot = slot_of(id_slot, engine.n_slots)
        if action == "erase":
            n_erased = await engine.on_slot(slot, partial(erase, engine.model, slot))
            return {"id_slot": slot, "n_erased": n_erased}
        if action not in FILE_ACTIONS:
            raise HTTPException(400, "Invalid action")
        name = filename_of(await request.body())
        return await FILE_ACTIONS[action](engine, slot, name, os.path.join(save_path, name))

    return router


def slot_of(text: str, n_slots: int) -> int:
    """The slot a path names; a 400 for no number or no slot of this server."""
    try:
        slot = int(text)
    except ValueError:
        slot = -1
    if not 0 <= slot < n_slots:
        raise HTTPException(400, "Invalid slot ID")
    return slot


def filename_of(body: bytes) -> str:
    """The body's `filename`, a 400 unless it is one file's name (fs_validate_filename)."""
    try:
        fields = json.loads(body or b"{}")
    except ValueError:
        raise shapes.FieldRefused("filename", "the body is not valid JSON") from None
    name = fields.get("filename") if isinstance(fields, dict) else None
    if not isinstance(name, str):
        raise shapes.FieldRefused("filename", "filename: the file's name is required")
    if not valid_filename(name):
        raise shapes.FieldRefused("filename", "Invalid filename")
    return name


def valid_filename(name: str) -> bool:
    """Whether `name` names one file in the save folder, as llama.cpp's fs_validate_filename
    judges it: no separator, no "..", nothing a filesystem would change or refuse."""
    if not name or any(c in FORBIDDEN or ord(c) <= 0x1F or 0x7F <= ord(c) <= 0x9F
                       or 0xD800 <= ord(c) <= 0xDFFF for c in name):
        return False
    if len(name.encode()) > 255 or name[0] == " " or name[-1] in " .":
        return False
    return ".." not in name


async def save(engine: Engine, slot: int, name: str, path: str) -> dict[str, Any]:
    try:  # the folder is made on first use (llama-server's tests name one not yet made)
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError:
        raise HTTPException(500, "Unable to save slot") from None
    saved = await engine.on_slot(slot, partial(save_file, engine.model, slot, path))
    if not saved.n_bytes:  # llama.cpp could not write it (no room, no permission)
        raise HTTPException(500, "Unable to save slot")
    return {"id_slot": slot, "filename": name, "n_saved": saved.n_tokens,
            "n_written": saved.n_bytes, "timings": {"save_ms": saved.seconds * 1e3}}


async def restore(engine: Engine, slot: int, name: str, path: str) -> dict[str, Any]:
    try:
        restored = await engine.on_slot(slot, partial(restore_file, engine.model, slot, path))
    except ValueError as exc:  # the slot is empty now
        raise HTTPException(400, f"Unable to restore slot: {exc}") from None
    return {"id_slot": slot, "filename": name, "n_restored": restored.n_tokens,
            "n_read": restored.n_bytes, "timings": {"restore_ms": restored.seconds * 1e3}}


FILE_ACTIONS = {"save": save, "restore": restore}

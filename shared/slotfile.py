"""llama-server's slot files (POST /slots/ID?action=save|restore), pure: the token list a
file records, and, for the fake model, the file itself.

A slot file is llama.cpp's sequence state file (llama_state_seq_save_file): magic 'ggsq',
a version, a count of token words and the words, then the sequence's cells. llama-server
records its server_tokens packed in the words (TOKEN_NULL, the packing's version, the
count and the ids, then media keys: none for text); servers before it recorded the plain
ids. Lead writes the packed form and reads both, so files travel between the two.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

MAGIC = 0x67677371  # 'ggsq': llama.cpp's LLAMA_STATE_SEQ_MAGIC
VERSION = 3  # llama.cpp's LLAMA_STATE_SEQ_VERSION (the fake's files carry it too)
TOKEN_NULL = -1  # opens llama-server's packed form
PACKING = 1  # llama-server's SERVER_TOKENS_STATE_VERSION
UNREADABLE = "No available space in KV cache or invalid slot save file"  # llama-server's


def packed(tokens: Sequence[int]) -> list[int]:
    """The words llama-server records for a text slot holding `tokens`."""
    return [TOKEN_NULL, PACKING, len(tokens), *tokens, 0]


def most_words(n_tokens: int) -> int:
    """The most words a text slot of at most `n_tokens` is recorded in."""
    return len(packed([])) + n_tokens


def unpacked(words: Sequence[int]) -> list[int]:
    """The tokens recorded in `words` (packed, or the plain list older servers wrote);
    ValueError, in llama-server's words where it has them, for what lead cannot hold."""
    if not words or words[0] != TOKEN_NULL:
        return list(words)
    if len(words) < 3 or words[1] != PACKING:
        raise ValueError("Unknown token packing in slot save file")
    n = words[2]
    tokens, media = list(words[3:3 + n]), words[3 + n:]
    if len(tokens) != n or not media:
        raise ValueError("Truncated token list in slot save file")
    if media[0] != 0:
        raise ValueError("Cannot restore media tokens without an mmproj")
    return tokens


def write(path: str, words: Sequence[int], state: bytes) -> int:
    """A sequence state file of `words` and `state` (the fake model's cells); its bytes."""
    head = struct.pack(f"<III{len(words)}i", MAGIC, VERSION, len(words), *words)
    Path(path).write_bytes(head + state)
    return len(head) + len(state)


def read(path: str) -> tuple[list[int], bytes, int]:
    """A sequence state file's words, its state and its size; ValueError (UNREADABLE) for
    no such file or one of another format."""
    try:
        data = Path(path).read_bytes()
        magic, version, n = struct.unpack_from("<III", data)
        words = list(struct.unpack_from(f"<{n}i", data, 12))
    except (OSError, struct.error):
        raise ValueError(UNREADABLE) from None
    if (magic, version) != (MAGIC, VERSION):
        raise ValueError(UNREADABLE)
    return words, data[12 + 4 * n:], len(data)

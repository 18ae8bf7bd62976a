"""python -m device.build: llama.cpp from the pack, as shared libraries and llama-server.

For a CUDA device it builds for one architecture (sm_90: the H100 and H200), flash
attention's vector kernel for an f16 KV cache only, no NCCL, and cuBLAS wherever the image
keeps it: a CUDA toolkit assembled from pip wheels (as this workplace's machines have) holds
no cuBLAS in /usr/local/cuda, and PyTorch's venv holds it as nvidia/cu13/{include,lib}
without the unversioned libcublas.so CMake looks for. A shim folder of links gives CMake and
the loader what they expect. The driver's libcuda is linked where it is found (CUDA's
virtual memory pool); where not, the build does without (GGML_CUDA_NO_VMM).

The libraries then go where llama-cpp-python looks (llama_cpp/lib beside its Python files):
the same source, the same ABI as its bindings.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TARGETS = ("llama", "llama-server")
COMMON = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON", "-DLLAMA_CURL=OFF",
          "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
          "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON",
          "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_RPC=ON",
          "-DGGML_NATIVE=ON")
# 144 nvcc compiles at these flags; on a busy 2-core EPYC here one took 12-48 s (mmq and
# flash attention's instances the dearest): docs/gpu.md. The KV cache is f16 (lead's and
# the back's), so flash attention's vector kernel is built for f16 K and V alone.
CUDA = ("-DGGML_CUDA=ON", "-DGGML_CUDA_FA=ON", "-DGGML_CUDA_FA_QUANTS=f16-f16",
        "-DGGML_CUDA_NCCL=OFF", "-DGGML_CUDA_COMPRESSION_MODE=none")
LIB_GLOBS = ("libllama.so*", "libggml*.so*", "libmtmd.so*")


@dataclass(frozen=True)
class Found:
    """Where cuBLAS's header and libraries are, and the driver's libcuda (None: not found)."""

    include: Path
    libs: Path
    driver: Path | None


def python_site_dirs() -> list[Path]:
    """Folders that may hold the nvidia/* wheels (PyTorch's venv on the device)."""
    out = []
    for python in ("python3", sys.executable):
        try:
            text = subprocess.run([python, "-c", "import site, sys; print(*site.getsitepackages(),"
                                   " *sys.path, sep='\\n')"], capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        out += [Path(line) for line in text.splitlines() if line.strip()]
    return out


def find_cublas(roots: list[Path]) -> tuple[Path, Path] | None:
    """(include folder, lib folder) of the first cublas_v2.h with libcublas beside it."""
    for root in roots:
        for header in sorted(glob.glob(str(root / "**" / "cublas_v2.h"), recursive=True)):
            include = Path(header).parent
            for lib in (include.parent / "lib64", include.parent / "lib",
                        Path("/usr/lib/x86_64-linux-gnu")):
                if list(lib.glob("libcublas.so*")) and list(lib.glob("libcublasLt.so*")):
                    return include, lib
    return None


def find_driver(roots: list[Path]) -> Path | None:
    for root in roots:
        hits = sorted(root.glob("libcuda.so*"))
        if hits:
            return hits[0]
    return None


def search_roots(cuda: Path) -> list[Path]:
    extra = [Path(p) for p in os.environ.get("DUO_CUBLAS_ROOT", "").split(":") if p]
    sites = [p / "nvidia" for p in python_site_dirs() if (p / "nvidia").is_dir()]
    return [*extra, cuda / "include", cuda / "targets", Path("/usr/include"), *sites]


def driver_roots(cuda: Path) -> list[Path]:
    return [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/local/nvidia/lib64"),
            Path("/usr/lib64"), cuda / "lib64" / "stubs", cuda / "lib64"]


def shim(found: Found, into: Path) -> Path:
    """Links under the names CMake and the linker look for: include/, lib/libcublas.so,
    lib/libcublasLt.so (and lib/libcuda.so where the driver was found)."""
    lib = into / "lib"
    lib.mkdir(parents=True, exist_ok=True)
    inc = into / "include"
    if inc.is_symlink() or inc.exists():
        inc.unlink()
    inc.symlink_to(found.include)
    for name in ("libcublas", "libcublasLt"):
        real = sorted(p for p in found.libs.glob(f"{name}.so*") if p.name.count(".") >= 2
                      or p.name == f"{name}.so")[-1]
        for link in (lib / f"{name}.so", lib / real.name):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(real)
    if found.driver:
        link = lib / "libcuda.so"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(found.driver)
    return into


def cuda_flags(arch: str, shim_dir: Path | None, driver: bool) -> list[str]:
    flags = [*CUDA, f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    if shim_dir is not None:
        lib = shim_dir / "lib"
        flags += [f"-DCMAKE_CUDA_FLAGS=-I{shim_dir / 'include'}",
                  f"-DCUDA_cublas_LIBRARY={lib / 'libcublas.so'}",
                  f"-DCUDA_cublasLt_LIBRARY={lib / 'libcublasLt.so'}",
                  f"-DCMAKE_SHARED_LINKER_FLAGS=-Wl,-rpath,{lib} -Wl,-rpath-link,{lib}",
                  f"-DCMAKE_EXE_LINKER_FLAGS=-Wl,-rpath,{lib} -Wl,-rpath-link,{lib}"]
        if driver:
            flags.append(f"-DCUDA_cuda_driver_LIBRARY={lib / 'libcuda.so'}")
    if not driver:
        flags.append("-DGGML_CUDA_NO_VMM=ON")
    return flags


def cpu_flags() -> list[str]:
    """As `make install` builds (x86: without AMX, which faulted on a Xeon VM)."""
    if platform.machine() in ("x86_64", "AMD64"):
        return ["-DCMAKE_C_FLAGS=-mno-amx-int8", "-DCMAKE_CXX_FLAGS=-mno-amx-int8"]
    return []


def configure_flags(device: str, arch: str, shim_dir: Path | None, driver: bool) -> list[str]:
    extra = cuda_flags(arch, shim_dir, driver) if device == "cuda" else []
    return [*COMMON, *cpu_flags(), *extra]


def run_logged(cmd: list[str], log: Path, timeout: float) -> float:
    """Run, appending its output to the log; its seconds. Raises on failure or timeout (its
    whole process group killed: ninja's compilers too, so that no nvcc runs on into the
    steps after)."""
    t0 = time.monotonic()
    with log.open("a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            raise
    if code:
        raise subprocess.CalledProcessError(code, cmd)
    return time.monotonic() - t0


def install_libs(build: Path, site: Path) -> list[str]:
    """Copy the built libraries into llama_cpp/lib, where llama-cpp-python loads them."""
    dest = site / "llama_cpp" / "lib"
    dest.mkdir(parents=True, exist_ok=True)
    names = []
    for pattern in LIB_GLOBS:
        for lib in sorted((build / "bin").glob(pattern)):
            shutil.copy2(lib, dest / lib.name, follow_symlinks=True)
            names.append(lib.name)
    return names


def build(a: argparse.Namespace) -> dict:
    src, out, log = Path(a.src), Path(a.build), Path(a.log)
    info: dict = {"device": a.device, "jobs": a.jobs}
    shim_dir, driver = None, False
    if a.device == "cuda":
        cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
        hit = find_cublas(search_roots(cuda))
        if hit is None:
            raise SystemExit("no cuBLAS (cublas_v2.h beside libcublas.so*) found")
        found = Found(*hit, find_driver(driver_roots(cuda)))
        shim_dir, driver = shim(found, out.resolve().parent / "cuda-shim"), found.driver is not None
        info |= {"cublas": str(found.libs), "driver": str(found.driver), "arch": a.arch}
    flags = configure_flags(a.device, a.arch, shim_dir, driver)
    info["flags"] = flags
    deadline = time.monotonic() + a.timeout
    info["configure_s"] = run_logged(["cmake", "-G", "Ninja", "-S", str(src), "-B", str(out),
                                      *flags], log, a.timeout)
    if a.configure_only:
        return info
    info["compile_s"] = run_logged(["ninja", "-C", str(out), "-j", str(a.jobs), *TARGETS], log,
                                   max(deadline - time.monotonic(), 1))
    info["libs"] = install_libs(out, Path(a.site))
    info["shim"] = str(shim_dir / "lib") if shim_dir else None
    return info


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m device.build", description=__doc__.splitlines()[0])
    p.add_argument("--src", required=True, help="llama.cpp's source (the pack's llama.cpp/)")
    p.add_argument("--build", required=True, help="build folder (kept: a rerun resumes)")
    p.add_argument("--site", required=True, help="the folder holding llama_cpp/")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--arch", default="90-real", help="CMAKE_CUDA_ARCHITECTURES")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=360, help="seconds for the whole build")
    p.add_argument("--configure-only", action="store_true",
                   help="stop after CMake (the rehearsal's check of the CUDA configuration)")
    p.add_argument("--log", required=True)
    p.add_argument("--json", required=True, help="where to write what was built, how long")
    a = p.parse_args(argv)
    try:
        info = build(a)
    except subprocess.TimeoutExpired:
        sys.exit(f"build: over {a.timeout:.0f} s (log: {a.log}); a rerun resumes it")
    except subprocess.CalledProcessError as exc:
        sys.exit(f"build: {exc.cmd[0]} failed (log: {a.log})")
    Path(a.json).write_text(json.dumps(info, indent=1))
    if a.configure_only:
        print(f"configured in {info['configure_s']:.0f} s", file=sys.stderr)
        return
    print(f"configure {info['configure_s']:.0f} s, compile {info['compile_s']:.0f} s, "
          f"{len(info['libs'])} libraries", file=sys.stderr)


if __name__ == "__main__":
    main()

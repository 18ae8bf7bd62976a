#!/usr/bin/env bash
# Build the llama-cpp-python wheel the Makefile pins, with CMAKE_ARGS, into WHEELS.
# usage: scripts/build-wheel.sh PY 'llama-cpp-python==X' WHEELS
# From the sdist, unpacked here so the vendored llama.cpp can be mended where this
# machine needs it: ggml-vulkan creates its instance with VK_EXT_layer_settings, which
# Vulkan headers before 1.3.261 (Debian 12 has 1.3.239) do not declare; without it the
# instance is made without those settings (they only tune the validation layer).
set -euo pipefail
PY=$1 LLAMA=$2 WHEELS=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --no-deps --no-binary llama-cpp-python -d "$work" "$LLAMA"
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/)
case "${CMAKE_ARGS:-}" in *GGML_VULKAN=on*)
  "$PY" "$(dirname "$0")/vulkan_headers.py" "$src/vendor/llama.cpp" ;;
esac
mkdir -p "$WHEELS"
"$PY" -m pip wheel --no-deps --no-cache-dir -w "$WHEELS" "$src"

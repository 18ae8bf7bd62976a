#!/usr/bin/env bash
# make vulkan: llama.cpp's Vulkan backend in a venv of its own (VENV, default .venv-vulkan)
# for tests/test_vulkan.py. Where no GPU is, Mesa's software driver (lavapipe) is the
# device. Debian's packages are installed where apt-get and root allow; else one line
# says why, and the tier skips. A build that fails with the packages there fails here.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv-vulkan}
PACKAGES="mesa-vulkan-drivers glslc libvulkan-dev spirv-headers"
missing() { for p in $PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || echo "$p"; done; }
if ! command -v dpkg >/dev/null; then
  echo "no dpkg here: install Vulkan's loader, headers, glslc and a driver, then GPU=vulkan" \
       "make install VENV=$VENV; the Vulkan tests skip"; exit 0
fi
need=$(missing)
if [ -n "$need" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing Debian's $need for the Vulkan tier"
    # shellcheck disable=SC2086
    apt-get install -y -q $need >/dev/null 2>&1 || \
      { apt-get update -q >/dev/null && apt-get install -y -q $need >/dev/null; } || true
  fi
  need=$(missing)
  [ -z "$need" ] || { echo "no $need (apt-get install as root): the Vulkan tests skip"; exit 0; }
fi
exec make --no-print-directory install GPU=vulkan VENV="$VENV"

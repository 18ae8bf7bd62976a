# duo — `make run` (lead + back + chat on the default pair) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
TARGET ?= qwen2.5-coder-1.5b
DRAFT  ?= qwen2.5-coder-0.5b

.PHONY: install models run test test-fast test-process lint bench advise clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "installing duo and llama-cpp-python (a fresh machine compiles llama.cpp: ~10 min)"
	$(PY) -m pip install -e '.[test]'
	touch $@

install: $(VENV)/.installed

models: install  ## download, assemble and verify the GGUF presets (cached, reused)
	$(PY) -m shared.presets smollm2-135m $(TARGET) $(DRAFT)

run: models  ## lead + back on the default pair, then the chat REPL
	TARGET=$(TARGET) DRAFT=$(DRAFT) PY=$(PY) scripts/run.sh

test: models  ## everything: unit, in-process, PTY chat and real-model tiers
	$(PY) -m pytest

test-fast: install  ## the unit tier: one process, fake models (about a minute)
	$(PY) -m pytest -m unit

test-process: install  ## the unit and process tiers: no real models
	$(PY) -m pytest -m "not real"

lint: install
	$(VENV)/bin/ruff check .

bench: models  ## every configuration side by side, bound, sweep (bench-results/)
	$(PY) -m bench $(BENCH_ARGS)

advise: models  ## will duo be faster on this machine? (about a minute)
	$(PY) -m bench --advise

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

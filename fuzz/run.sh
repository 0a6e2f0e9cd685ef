#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer targets (clang, ASan + UBSan) in BUILD_DIR and runs each for
# SECONDS on a scratch copy of its seed corpus (the repo's corpus is never written). Fails when a
# target crashes, leaks, times out or trips a sanitizer; the input is kept in
# BUILD_DIR/artifacts/ (copy it to fuzz/regressions/<target>/ once fixed).
#   fuzz/run.sh [BUILD_DIR] [SECONDS] [TARGET...]
# FUZZ_ARGS adds libFuzzer flags (e.g. -max_len=65536); FUZZ_SUMMARY moves the summary table.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-fuzz}
SECONDS_EACH=${2:-60}
shift $(( $# > 2 ? 2 : $# ))
TARGETS=("$@")
[[ ${#TARGETS[@]} -gt 0 ]] || TARGETS=(gguf_fuzz tokenizer_fuzz chat_template_fuzz request_fuzz \
  config_fuzz openai_request_fuzz json_schema_fuzz hf_fuzz)
JOBS=${FUZZ_JOBS:-2}
export WINNOW_FUZZ_MODEL=${WINNOW_FUZZ_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}

# Debian 12's clang 14 ships libFuzzer in libclang-rt-14-dev.
libfuzzer="/usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a"
if ! command -v clang++ >/dev/null || ! compgen -G "$libfuzzer" >/dev/null; then
  SUDO=$([[ $(id -u) -eq 0 ]] || echo sudo)
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev
fi
if [[ ! -f $BUILD_DIR/build.ninja ]]; then
  # -O1 and line tables only: a fuzz build is compiled often and must stay quick to build.
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DWINNOW_FUZZ=ON -DWINNOW_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only"
fi
nice -n 10 cmake --build "$BUILD_DIR" -j "$JOBS" --target "${TARGETS[@]}"

mkdir -p "$BUILD_DIR/artifacts" "$BUILD_DIR/fuzz-logs"
summary=${FUZZ_SUMMARY:-$BUILD_DIR/fuzz-summary.md}
echo "| target | seconds | executions | exec/s | cov | ft | corpus | result |" > "$summary"
echo "|---|---|---|---|---|---|---|---|" >> "$summary"
failed=0
for t in "${TARGETS[@]}"; do
  scratch=$(mktemp -d)
  cp -r "fuzz/corpus/$t/." "$scratch/"
  log="$BUILD_DIR/fuzz-logs/$t.log"
  echo "== $t: ${SECONDS_EACH}s"
  status=0
  # -timeout: an input that takes 25 s is a hang, reported like a crash.
  nice -n 10 "$BUILD_DIR/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$BUILD_DIR/artifacts/$t-" ${FUZZ_ARGS:-} "$scratch" \
    > "$log" 2>&1 || status=$?
  rm -rf "$scratch"
  done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$done_line")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<< "$done_line")
  result=ok
  if [[ $status -ne 0 ]]; then
    result="FAILED (exit $status, see $log)"
    failed=1
    grep -E 'ERROR: |SUMMARY: |Test unit written' "$log" | head -5 || true
  fi
  row="| $t | $SECONDS_EACH | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?}"
  echo "$row | $result |" >> "$summary"
done
cat "$summary"
exit $failed

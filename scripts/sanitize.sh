#!/usr/bin/env bash
# Builds the C++ core, its GoogleTest suite and the C++-only example with AddressSanitizer and
# UndefinedBehaviorSanitizer (DEEPINFER_SANITIZE; CPU backend only) in build/sanitize, then runs
# the suite (deepinfer_tests: leaks, memory errors and undefined behaviour on every path it
# takes) and the example on the tiny checkpoint when the Python package is installed to make it.
# Any report fails the run: ASan stops at its first error, UBSan's reports are counted. Extra
# arguments go to the suite (e.g. --gtest_filter=...). About 20 minutes on 2 cores; not in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
SANITIZERS=${SANITIZERS:-address,undefined}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S . -B build/sanitize "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DDEEPINFER_SANITIZE="$SANITIZERS" -DDEEPINFER_DEBUG_INVARIANTS=ON -DDEEPINFER_WERROR=ON \
  -DDEEPINFER_PYTHON=OFF -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_EXAMPLES=ON \
  -DDEEPINFER_BUILD_BENCHMARKS=OFF -DDEEPINFER_CUDA=OFF
cmake --build build/sanitize -j "$JOBS" --target deepinfer_tests cpp_generate
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

status=0
# run NAME LOG COMMAND...: the command's output to LOG; fails the script on a non-zero exit or a
# UBSan report.
run() {
  local name=$1 log=$2
  shift 2
  printf '\n==> %s (log: %s)\n' "$name" "$log"
  "$@" >"$log" 2>&1 || status=1
  # The summary lines (the suite's, the example's, a sanitizer's), else the log's end.
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|tokens generated|^SUMMARY: ' "$log" || tail -3 "$log"
  local reports
  reports=$(grep -c "runtime error:" "$log" || true)
  if [ "$reports" -gt 0 ]; then
    echo "$reports UBSan reports:"
    grep "runtime error:" "$log" | sort | uniq -c | head -20
    status=1
  fi
}
run deepinfer_tests build/sanitize/deepinfer_tests.log \
  build/sanitize/tests/cpp/deepinfer_tests --gtest_brief=1 "$@"
if tiny=$("$PYTHON" -m deepinfer.tiny 2>/dev/null); then
  run cpp_generate build/sanitize/cpp_generate.log \
    build/sanitize/examples/cpp_generate/cpp_generate "$tiny" --max-tokens 8
else
  echo "(the C++-only example skipped: $PYTHON -m deepinfer.tiny is not available to make the tiny checkpoint)"
fi
[ "$status" -eq 0 ] && echo "sanitizers: clean"
exit $status

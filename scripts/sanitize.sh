#!/usr/bin/env bash
# Builds the C++ core, its GoogleTest suite and the C++-only example with AddressSanitizer and
# UndefinedBehaviorSanitizer (DEEPINFER_SANITIZE; CPU backend only) in build/sanitize, then runs
# the suite (deepinfer_tests: leaks, memory errors and undefined behaviour on every path it
# takes) and the example on the tiny checkpoint when the Python package is installed to make it.
# Any report fails the run: ASan stops at its first error, UBSan's reports are counted. Extra
# arguments go to the suite (e.g. --gtest_filter=...). About 20 minutes on 2 cores; not in CI.
#
#   bash scripts/sanitize.sh [--python] [suite arguments]
#
# --python: then also builds the deepinfer_core module with the same sanitizers (build/sanitize-py)
# and runs the Python suite through it (PYTEST_ARGS, default tests/python), the sanitizer runtimes
# preloaded into the interpreter. Leak detection is off there: CPython keeps allocations alive
# until exit by design, so every run would report them. About 60 minutes more on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
python_suite=0
if [ "${1:-}" = "--python" ]; then
  python_suite=1
  shift
fi
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
  # The summary lines (the suites', the example's, a sanitizer's), else the log's end.
  grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|tokens generated|^SUMMARY: |^[0-9]+ (passed|failed)' \
    "$log" || tail -3 "$log"
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
if [ "$python_suite" -eq 1 ]; then
  cmake -S . -B build/sanitize-py "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDEEPINFER_SANITIZE="$SANITIZERS" -DDEEPINFER_DEBUG_INVARIANTS=ON -DDEEPINFER_WERROR=ON \
    -DDEEPINFER_PYTHON=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_EXAMPLES=OFF \
    -DDEEPINFER_BUILD_BENCHMARKS=OFF -DDEEPINFER_CUDA=OFF -DPython_EXECUTABLE="$(command -v "$PYTHON")"
  cmake --build build/sanitize-py -j "$JOBS" --target deepinfer_core
  # The interpreter is not built with the sanitizers, so their runtimes must load first.
  preload=()
  for pair in address:libasan.so undefined:libubsan.so; do
    case ",$SANITIZERS," in
    *",${pair%%:*},"*) ;;
    *) continue ;;
    esac
    lib=${pair#*:}
    path=$("${CXX:-c++}" -print-file-name="$lib")
    if [ "$path" = "$lib" ]; then
      echo "sanitize.sh: ${CXX:-c++} has no $lib to preload into $PYTHON" >&2
      exit 1
    fi
    preload+=("$path")
  done
  # Any report stops the process that made it (UBSan's halt_on_error; ASan always stops), so a
  # report in a server test's child process fails that test; -s keeps pytest from capturing the
  # reports of its own process, so they reach the log.
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
  run "pytest (sanitized deepinfer_core)" build/sanitize-py/pytest.log \
    env LD_PRELOAD="${preload[*]}" ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" \
    UBSAN_OPTIONS="$UBSAN_OPTIONS:halt_on_error=1" \
    PYTHONPATH="$PWD/build/sanitize-py/bindings:$PWD/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$PYTHON" -m pytest -q -s -p no:cacheprovider ${PYTEST_ARGS:-tests/python}
fi
[ "$status" -eq 0 ] && echo "sanitizers: clean"
exit $status

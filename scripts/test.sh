#!/usr/bin/env bash
# Installs the test extras and runs the whole CPU test suite: static checks, the GoogleTest suite
# (ctest) and pytest (the GPU tests in tests/gpu skip without a CUDA device).
# Builds with warnings as errors. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
step() { printf '\n==> %s\n' "$*"; }

step "system packages (GoogleTest, clang-format)"
missing=()
dpkg -s libgtest-dev >/dev/null 2>&1 || missing+=(libgtest-dev)
command -v clang-format >/dev/null 2>&1 || missing+=(clang-format)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
if ((${#missing[@]})); then
  sudo_cmd=()
  [ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

step "pip install .[test] (C++ core + bindings, warnings as errors)"
start=$(date +%s)
"$PYTHON" -m pip install --quiet ".[test]" --config-settings=cmake.define.DEEPINFER_WERROR=ON
echo "installed in $(( $(date +%s) - start )) s"

step "static checks"
"$PYTHON" -m ruff check python tests
"$PYTHON" -m ruff format --check python tests
git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format --dry-run --Werror

step "C++ tests (GoogleTest)"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S . -B build/cpp-tests "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_WERROR=ON \
  -DDEEPINFER_PYTHON=OFF -DDEEPINFER_BUILD_TESTS=ON -DDEEPINFER_BUILD_EXAMPLES=ON \
  -DDEEPINFER_BUILD_BENCHMARKS=ON -DDEEPINFER_CUDA=OFF
cmake --build build/cpp-tests -j "$JOBS"
ctest --test-dir build/cpp-tests --output-on-failure -j "$JOBS"

step "C++-only example (libdeepinfer without Python) on the tiny checkpoint"
build/cpp-tests/examples/cpp_generate/cpp_generate "$("$PYTHON" -m deepinfer.tiny)" --max-tokens 8

step "Python tests (pytest)"
"$PYTHON" -m pytest -q

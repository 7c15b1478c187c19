#!/usr/bin/env bash
# Runs on the GPU device machine: builds libdeepinfer with the CUDA backend (sm_90a; sm_100a is
# compile-checked on the development machine), then the backend op table (every CUDA op against
# the CPU op, tests/backend_ops), the CUDA-only op tests (tests/gpu/cpp), the GPU pytest suite
# (tests/gpu, marker `gpu`) and the benchmarks. Logs and results go to $OUT.
#
# The device has no network: GoogleTest (Debian's libgtest-dev .deb) and transformers 5.23 (the
# parity oracle; the image has 5.17) travel in .devcarry/, which scripts/prepare_devcarry.sh fills.
#   usage: bash scripts/gpu_check.sh [tests|bench|all]
set -uo pipefail
cd "$(dirname "$0")/.."
what=${1:-all}
OUT=${OUT:-/tmp/deepinfer-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/nvidia-smi.txt"

mkdir -p /tmp/gtest && dpkg -x .devcarry/libgtest-dev_*.deb /tmp/gtest
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/transformers-*.whl
export PYTHONPATH=/tmp/site:$PWD/python:$PWD/build/gpu/bindings

start=$(date +%s)
cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON \
  -DDEEPINFER_CUDA_ARCHITECTURES=90a -DDEEPINFER_PYTHON=ON -DDEEPINFER_BUILD_TESTS=ON \
  -DDEEPINFER_BUILD_BENCHMARKS=ON \
  -DGTest_DIR=/tmp/gtest/usr/lib/x86_64-linux-gnu/cmake/GTest > "$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
cmake --build build/gpu -j 16 --target deepinfer_backend_ops deepinfer_gpu_tests deepinfer_core cuda_op_bench \
  > "$OUT/build.log" 2>&1 || { grep -E "error|Error" -A5 "$OUT/build.log" | head -80; exit 1; }
echo "build: $(( $(date +%s) - start )) s"
python3 -c "import deepinfer_core as d; print(d.build_info())"

rc=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  # A CUDA backend that cannot be created fails the op tests instead of skipping them.
  export DEEPINFER_REQUIRE_DEVICE=1
  ./build/gpu/tests/backend_ops/deepinfer_backend_ops --gtest_brief=1 2>&1 |
    tee "$OUT/backend_ops.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  # Under a time limit: a kernel whose barriers deadlock hangs rather than fails (exit 124 then).
  timeout "${GPU_TESTS_TIMEOUT:-600}" ./build/gpu/tests/gpu/cpp/deepinfer_gpu_tests --gtest_brief=1 2>&1 |
    tee "$OUT/gpu_op_tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
  # The two binaries just ran; tests/gpu/test_cuda_ops.py (which runs them too) is left out here.
  # -s: the figures some GPU tests print (QUANT-GPU ...) reach the log.
  python3 -m pytest tests/gpu -m gpu -q -s -p no:cacheprovider --deselect tests/gpu/test_cuda_ops.py \
    2>&1 | tee "$OUT/pytest_gpu.log" | tail -30
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  ./build/gpu/benchmarks/cuda_op_bench 2>&1 | tee "$OUT/op_bench.jsonl"
  timeout "${MODEL_BENCH_TIMEOUT:-420}" python3 benchmarks/gpu_model_bench.py --out "$OUT/model_bench.json" \
    2>&1 | tee "$OUT/model_bench.log"
fi
exit $rc

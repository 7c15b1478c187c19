#!/usr/bin/env bash
# Before/after benchmarks of a change, measured in one run on the GPU machine: the engine-overhead
# benchmark and the GPU model benchmark (deepinfer only) of a baseline commit and of this tree,
# built side by side and run alternately.
#   here:   bash scripts/gpu_before_after.sh prepare <baseline-rev>   # fills .baseline/ (ignored)
#   device: bash scripts/gpu_before_after.sh run [rounds]             # carry [".baseline"]
set -uo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
  prepare)
    rev=${2:?usage: gpu_before_after.sh prepare <baseline-rev>}
    grep -qx "/.baseline/" .git/info/exclude 2>/dev/null || echo "/.baseline/" >> .git/info/exclude
    rm -rf .baseline && mkdir -p .baseline && git archive "$rev" | tar -x -C .baseline
    echo "baseline $(git rev-parse --short "$rev") in .baseline/"
    ;;
  run)
    rounds=${2:-3}
    OUT=${OUT:-/tmp/deepinfer-gpu-out}
    mkdir -p "$OUT"
    export PYTHONUNBUFFERED=1
    [ -d .baseline ] || { echo "no .baseline/: run 'prepare' here and carry it"; exit 1; }
    for v in base new; do
      src=$PWD; [ $v = base ] && src=$PWD/.baseline
      cmake -S "$src" -B build/$v -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON \
        -DDEEPINFER_CUDA_ARCHITECTURES=90a -DDEEPINFER_PYTHON=ON -DDEEPINFER_BUILD_BENCHMARKS=ON \
        > "$OUT/configure_$v.log" 2>&1 || { tail -20 "$OUT/configure_$v.log"; exit 1; }
      cmake --build build/$v -j 16 --target deepinfer_core engine_overhead > "$OUT/build_$v.log" 2>&1 ||
        { grep -E "error" -A5 "$OUT/build_$v.log" | head -20; exit 1; }
    done
    for round in $(seq "$rounds"); do
      for v in base new; do
        src=$PWD; [ $v = base ] && src=$PWD/.baseline
        echo "== $v, round $round"
        ./build/$v/benchmarks/engine_overhead --steps 4000 --gap-steps 300 | tee -a "$OUT/engine_overhead_$v.log"
        PYTHONPATH=$PWD/build/$v/bindings timeout 300 python3 "$src/benchmarks/gpu_model_bench.py" \
          --skip-transformers --out "$OUT/model_bench_${v}_$round.json" | grep '^deepinfer '
      done
    done
    ;;
  *)
    echo "usage: gpu_before_after.sh prepare <baseline-rev> | run [rounds]"
    exit 2
    ;;
esac

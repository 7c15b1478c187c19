#!/usr/bin/env bash
# Device entry point (from the repo root):  bash .devcarry/flashmla/run.sh
# Builds the SM90-only FlashMLA peer module, then benchmarks it at deepinfer's shapes.
# Writes $OUT/flashmla_build.log, $OUT/flashmla.jsonl (one JSON line per case/check) and
# $OUT/flashmla_bench.log (stderr of the benchmark). Whole run is kept under ~6 minutes.
# Env: BUILD_TIMEOUT_S (240), TOTAL_BUDGET_S (360), BENCH_ARGS (extra bench.py flags).
set -uo pipefail

PKG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${OUT:-$PWD/flashmla_out}"
mkdir -p "$OUT"
BUILD_TIMEOUT_S="${BUILD_TIMEOUT_S:-240}"
TOTAL_BUDGET_S="${TOTAL_BUDGET_S:-360}"
T0=$(date +%s)

echo "[flashmla run] build (timeout ${BUILD_TIMEOUT_S}s) -> $OUT/flashmla_build.log"
timeout --kill-after=10 "$BUILD_TIMEOUT_S" bash "$PKG_DIR/build.sh" >"$OUT/flashmla_build.log" 2>&1
rc=$?
grep -E '^\[flashmla build\]|^\[setup_sm90\]' "$OUT/flashmla_build.log" | tail -n 20
grep -E 'registers|spill' "$OUT/flashmla_build.log" | grep -v ' 0 bytes spill stores, 0 bytes spill loads' | head -n 20 || true
if [[ $rc -ne 0 ]]; then
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "[flashmla run] BUILD TIMED OUT after ${BUILD_TIMEOUT_S}s"
  echo "[flashmla run] BUILD FAILED rc=$rc; first errors:"
  grep -n -E 'error|Error|FAILED' "$OUT/flashmla_build.log" | head -n 40
  tail -n 30 "$OUT/flashmla_build.log"
  exit "$rc"
fi

ELAPSED=$(( $(date +%s) - T0 ))
BENCH_TIMEOUT_S=$(( TOTAL_BUDGET_S - ELAPSED ))
(( BENCH_TIMEOUT_S < 90 )) && BENCH_TIMEOUT_S=90
echo "[flashmla run] build took ${ELAPSED}s; bench (timeout ${BENCH_TIMEOUT_S}s) -> $OUT/flashmla.jsonl"
# shellcheck disable=SC2086
timeout --kill-after=10 "$BENCH_TIMEOUT_S" python3 "$PKG_DIR/bench.py" ${BENCH_ARGS:-} \
  >"$OUT/flashmla.jsonl" 2>"$OUT/flashmla_bench.log"
rc=$?
cat "$OUT/flashmla.jsonl"
if [[ $rc -ne 0 ]]; then
  [[ $rc -eq 124 || $rc -eq 137 ]] && echo "[flashmla run] BENCH TIMED OUT after ${BENCH_TIMEOUT_S}s"
  echo "[flashmla run] BENCH rc=$rc; stderr tail:"
  tail -n 40 "$OUT/flashmla_bench.log"
fi
echo "[flashmla run] total wall_s=$(( $(date +%s) - T0 ))"
exit "$rc"

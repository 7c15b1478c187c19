#!/usr/bin/env bash
# Builds upstream FlashMLA's SM90 sparse kernels (throwaway peer build, benchmarking only) on the
# offline GPU machine. Run from the repo root:  bash .devcarry/flashmla/build.sh
# Unpacks into $FLASHMLA_WORK (default /tmp/flashmla); the built module is importable as
#   PYTHONPATH=$FLASHMLA_WORK/FlashMLA python3 -c 'import flash_mla'
# Env: FLASHMLA_WORK, MAX_JOBS (default 16), FLASHMLA_KEEP=1 (reuse an earlier successful build).
set -euo pipefail

PKG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
WORK="${FLASHMLA_WORK:-/tmp/flashmla}"
SRC="$WORK/FlashMLA"
export MAX_JOBS="${MAX_JOBS:-16}"
export TORCH_CUDA_ARCH_LIST="9.0a"
PYTHON="${PYTHON:-python3}"
T0=$(date +%s)

die() { echo "[flashmla build] FAILED: $*" >&2; echo "[flashmla build] wall_s=$(( $(date +%s) - T0 ))" >&2; exit 1; }
trap 'die "command failed at line $LINENO: $BASH_COMMAND"' ERR
log() { echo "[flashmla build] $*"; }

if [[ "${FLASHMLA_KEEP:-0}" == "1" && -f "$WORK/BUILD_OK" ]]; then
  log "FLASHMLA_KEEP=1 and $WORK/BUILD_OK exists: reusing $(cat "$WORK/BUILD_OK")"
  exit 0
fi

for f in flashmla_src.tar.gz cutlass_include.tar.gz sm90_only_stubs.cpp setup_sm90.py; do
  [[ -f "$PKG_DIR/$f" ]] || die "missing package file $PKG_DIR/$f"
done

# --- toolchain -----------------------------------------------------------------------------
# Same order as torch: $CUDA_HOME, then the nvcc on PATH (resolved), then /usr/local/cuda.
if [[ -z "${CUDA_HOME:-}" ]]; then
  NVCC_ON_PATH="$(command -v nvcc 2>/dev/null || true)"
  CANDIDATES=()
  [[ -n "$NVCC_ON_PATH" ]] && CANDIDATES+=("$(dirname "$(dirname "$(readlink -f "$NVCC_ON_PATH")")")")
  CANDIDATES+=(/usr/local/cuda /usr/local/cuda-13.0)
  for c in "${CANDIDATES[@]}"; do
    if [[ -x "$c/bin/nvcc" && -f "$c/include/cuda_runtime.h" ]]; then export CUDA_HOME="$c"; break; fi
  done
fi
[[ -n "${CUDA_HOME:-}" && -x "$CUDA_HOME/bin/nvcc" ]] || die "no CUDA toolkit found (set CUDA_HOME)"
export CUDA_HOME
export PATH="$CUDA_HOME/bin:$PATH"
log "nvcc: $(command -v nvcc) | $(nvcc --version | grep -o 'release [0-9.]*')"
log "CUDA_HOME=$CUDA_HOME"
log "g++: $(g++ --version | head -1)"
log "python: $($PYTHON --version 2>&1) | torch: $($PYTHON -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)')"
nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader 2>/dev/null || log "(nvidia-smi unavailable)"

# --- unpack ------------------------------------------------------------------------------------
rm -rf "$WORK"
mkdir -p "$WORK"
tar -xzf "$PKG_DIR/flashmla_src.tar.gz" -C "$WORK"
[[ -f "$SRC/csrc/api/api.cpp" ]] || die "flashmla_src.tar.gz did not unpack to $SRC"
mkdir -p "$SRC/csrc/cutlass"
tar -xzf "$PKG_DIR/cutlass_include.tar.gz" -C "$SRC/csrc/cutlass"
[[ -f "$SRC/csrc/cutlass/include/cute/tensor.hpp" ]] || die "cutlass headers did not unpack"
cp "$PKG_DIR/sm90_only_stubs.cpp" "$SRC/csrc/sm90_only_stubs.cpp"
cp "$PKG_DIR/setup_sm90.py" "$SRC/setup_sm90.py"
log "unpacked to $SRC ($(cat "$SRC/UPSTREAM_COMMITS.txt" | tr '\n' ';'))"

# --- ninja (torch's BuildExtension compiles serially without it) ---------------------------------
if command -v ninja >/dev/null 2>&1 && ninja --version >/dev/null 2>&1; then
  log "ninja $(ninja --version) already on PATH"
else
  WHEEL=$(ls "$PKG_DIR"/ninja-*.whl 2>/dev/null | head -1 || true)
  [[ -n "$WHEEL" ]] || die "ninja not on PATH and no ninja wheel in $PKG_DIR"
  if $PYTHON -m pip install --no-index --no-deps --quiet --target "$WORK/ninja_py" "$WHEEL" \
      && [[ -x "$WORK/ninja_py/bin/ninja" ]]; then
    export PATH="$WORK/ninja_py/bin:$PATH"
  else
    log "pip install of the ninja wheel failed; extracting the binary directly"
    mkdir -p "$WORK/ninja_bin"
    $PYTHON - "$WHEEL" "$WORK/ninja_bin/ninja" <<'EOF'
import sys, zipfile, os
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.endswith("/scripts/ninja") or n.endswith("/bin/ninja"))
    with z.open(name) as src, open(dest, "wb") as out:
        out.write(src.read())
os.chmod(dest, 0o755)
EOF
    export PATH="$WORK/ninja_bin:$PATH"
  fi
  ninja --version >/dev/null 2>&1 || die "ninja from the wheel does not run"
  log "ninja $(ninja --version) from $WHEEL"
fi

# --- build -------------------------------------------------------------------------------------
cd "$SRC"
T_BUILD=$(date +%s)
log "building with MAX_JOBS=$MAX_JOBS (8 translation units, sm_90a only)"
$PYTHON setup_sm90.py build_ext --inplace
SO=$(ls "$SRC"/flash_mla/cuda*.so 2>/dev/null | head -1 || true)
[[ -n "$SO" ]] || die "no flash_mla/cuda*.so produced"
log "compile+link wall_s=$(( $(date +%s) - T_BUILD )) -> $SO ($(du -h "$SO" | cut -f1))"

# Import check (needs the CUDA runtime of torch, not a GPU kernel launch).
PYTHONPATH="$SRC${PYTHONPATH:+:$PYTHONPATH}" $PYTHON -c "
import torch, flash_mla, flash_mla.cuda as m
print('[flashmla build] import ok:', m.__file__, [n for n in dir(m) if not n.startswith('_')])
"
echo "$SRC" > "$WORK/BUILD_OK"
trap - ERR
log "OK total wall_s=$(( $(date +%s) - T0 ))"

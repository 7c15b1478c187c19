#!/usr/bin/env bash
# Packs upstream FlashMLA's SM90 sparse decode / sparse prefill (the peer of issue 11's attention
# benchmarks) for the GPU machine, which has no network, into .devcarry/flashmla/: FlashMLA's
# sources at the commit below (only the files in flashmla_files.txt: its SM90 kernels, the API,
# its tests' helpers and the declaration headers the API includes), CUDA's CUTLASS headers at
# FlashMLA's submodule pin, this folder's build and bench scripts, and a ninja wheel. Peer code
# is built and read there, never copied into the repository.
#   usage: bash benchmarks/peers/flashmla/prepare.sh FLASHMLA_GIT_DIR CUTLASS_GIT_DIR
# (git directories of github:deepseek-ai/FlashMLA and github:NVIDIA/cutlass, e.g. from the fetch
# tool); then on the device: bash .devcarry/flashmla/run.sh (outputs in $OUT).
set -euo pipefail
cd "$(dirname "$0")/../../.."
FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
CUTLASS_COMMIT=147f5673d0c1c3dcf66f78d677fd647e4a020219  # v4.3.0-56, FlashMLA's csrc/cutlass pin
flashmla_git=${1:?FlashMLA git directory}
cutlass_git=${2:?CUTLASS git directory}
here=benchmarks/peers/flashmla
out=.devcarry/flashmla
grep -qx "/.devcarry/" .git/info/exclude 2>/dev/null || echo "/.devcarry/" >> .git/info/exclude
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/FlashMLA"
# shellcheck disable=SC2046
git -C "$flashmla_git" archive "$FLASHMLA_COMMIT" $(cat "$here/flashmla_files.txt") |
  tar -x -C "$tmp/FlashMLA"
printf 'FlashMLA %s\ncutlass %s: include/ tools/util/include/ only\n' "$FLASHMLA_COMMIT" \
  "$CUTLASS_COMMIT" > "$tmp/FlashMLA/UPSTREAM_COMMITS.txt"
tar -czf "$out/flashmla_src.tar.gz" -C "$tmp" FlashMLA
git -C "$cutlass_git" archive "$CUTLASS_COMMIT" include tools/util/include LICENSE.txt |
  gzip > "$out/cutlass_include.tar.gz"
cp "$here"/{bench.py,reference.py,build.sh,run.sh,setup_sm90.py,sm90_only_stubs.cpp} "$out/"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 -d "$out" ninja
ls -la "$out"

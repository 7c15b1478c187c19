#!/usr/bin/env bash
# Fills .devcarry/ (ignored by git) with what scripts/gpu_check.sh needs on the GPU machine, which
# has no network: Debian's GoogleTest package and the transformers 5.23 wheel (the parity oracle;
# the device image has 5.17). Run on the development machine, then pass carry=[".devcarry"].
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devcarry
grep -qx "/.devcarry/" .git/info/exclude 2>/dev/null || echo "/.devcarry/" >> .git/info/exclude
(cd .devcarry && apt-get download libgtest-dev)
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d .devcarry transformers==5.23.0
ls -la .devcarry

#!/usr/bin/env bash
# Downloads flash-linear-attention's two wheels (fla-core holds the Triton kernels, flash-linear-attention its
# layers and models; both pure Python) into benchmarks/gpu/wheels, where run.sh installs them for its PyTorch
# side: `pip install --no-deps --no-index` into a scratch folder. A lent GPU machine has no internet, and its
# image holds what they import (torch, triton, einops, packaging, transformers). The folder is not to be
# committed: keep it out of git (e.g. `echo /benchmarks/gpu/wheels/ >> .git/info/exclude`).
#
#   bash benchmarks/gpu/fetch_wheels.sh [DIR]       (DIR: benchmarks/gpu/wheels)
set -euo pipefail
dir="${1:-$(cd "$(dirname "$0")" && pwd)/wheels}"
mkdir -p "$dir"
"${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" \
  flash-linear-attention==0.6.0 fla-core==0.6.0
ls -l "$dir"

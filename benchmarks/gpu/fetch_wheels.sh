#!/usr/bin/env bash
# Downloads flash-linear-attention's two wheels (fla-core holds the Triton kernels, flash-linear-attention its
# layers and models; both pure Python) into benchmarks/gpu/wheels, and Keras' and keras-hub's into wheels/jax:
# run.sh installs each set for its side (PyTorch, JAX) with `pip install --no-deps --no-index` into a scratch
# folder. A lent GPU machine has no internet, and its image holds the rest of what they import (torch, triton,
# einops, packaging, transformers, jax). The folder is not to be committed: keep it out of git (e.g.
# `echo /benchmarks/gpu/wheels/ >> .git/info/exclude`).
#
#   bash benchmarks/gpu/fetch_wheels.sh [DIR]       (DIR: benchmarks/gpu/wheels)
set -euo pipefail
dir="${1:-$(cd "$(dirname "$0")" && pwd)/wheels}"
mkdir -p "$dir"
"${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir" \
  flash-linear-attention==0.6.0 fla-core==0.6.0
# The JAX side's: Keras, keras-hub and what they import that the image lacks (tensorflow-text is imported only by
# keras-hub's tokenizers, which the benchmarks do not use). optree is compiled: the machine's Python 3.12, x86-64.
"${PYTHON:-python3}" -m pip download --quiet --no-deps --only-binary=:all: -d "$dir/jax" --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 optree==0.20.0 kagglehub kagglesdk
ls -l "$dir" "$dir/jax"

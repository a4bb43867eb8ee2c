#!/usr/bin/env bash
# The first training step (tracing, XLA's compilation and one step) of the 25M size at T = 2048, B = 1, XLA,
# on the CPU, for each checkout given, one process at a time (a GPU's first-step cost, measured without a GPU).
# It prints each checkout's table; keep it under benchmarks/results/, for instance:
#
#   bash benchmarks/first_step.sh BEFORE_CHECKOUT AFTER_CHECKOUT > benchmarks/results/MACHINE-DATE/first_step.txt
set -euo pipefail
for checkout in "$@"; do
  checkout="$(cd "$checkout" && pwd)"
  echo "## $checkout"
  (cd "$checkout/benchmarks" && PYTHONPATH="$checkout" python training_step.py --size 25m --jit-compile \
     --sequence-lengths 2048 --tokens 2048 --repeats 2 --timeout 420 --architectures elita transformer 2>&1 \
     | grep -E "^\||^#|constant-folding|reduce-window" | cut -c1-300) || true
done

#!/usr/bin/env bash
# Zoology's MQAR grid on a GPU, on JAX (no TensorFlow): `elita-recall --protocol zoology`, Zoology's figure-2 model
# and data, its widths 64 to 512 and its four learning rates, for the designs, their short-convolution variants
# and the hybrids. The task of sequence length 128 with 8 pairs comes first, then 64 with 4, then 256 with 16.
#
#   bash benchmarks/gpu/recall.sh [--quick] [OUTPUT_DIR]      (from anywhere; OUTPUT_DIR: benchmarks/gpu/results)
#
# JAX_PYTHON (default python3) runs it, with Keras and keras-hub from benchmarks/gpu/wheels/jax where they are
# there (fetch_wheels.sh), as run.sh's JAX side. ELITA_RECALL_ARCHITECTURES overrides the architectures,
# ELITA_RECALL_TASKS the tasks (SEQUENCE_LENGTH:NUM_PAIRS ...). No cell starts after ELITA_RECALL_BUDGET_S seconds
# (default 480); the cells in training then finish. It writes OUTPUT_DIR/recall/ (elita-recall's cells, recall.md,
# recall.json and the plots) and OUTPUT_DIR/recall.log. The same command again goes on with the cells not yet
# trained; elita-recall with the same flags on any machine rebuilds the report from the cells. --quick runs
# `--quick`'s toy grid under Zoology's protocol on a CPU in about a minute (CI runs it).
set -euo pipefail
source "$(dirname "$0")/arguments.sh" "$@"
log="$out/recall.log"
: > "$log"
source "$(dirname "$0")/jax_side.sh"
flags=(--protocol zoology --output-dir "$out/recall" --time-limit "${ELITA_RECALL_BUDGET_S:-480}")
if [ "$quick" = 1 ]; then
  flags+=(--quick)  # its two designs and toy task
else
  architectures="transformer elita-hybrid elita-conv linear-conv elita linear 3lin additive simplified"
  flags+=(--tasks ${ELITA_RECALL_TASKS:-128:8 64:4 256:16} --architectures ${ELITA_RECALL_ARCHITECTURES:-$architectures})
fi
"${jax_env[@]}" PYTHONUNBUFFERED=1 "$jax_python" -m elita_tf.cli.recall "${flags[@]}" 2>&1 | tee -a "$log"

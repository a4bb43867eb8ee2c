#!/usr/bin/env bash
# Quality at a realistic size: ELiTA against the Transformer at the 25M size (MODEL_SIZES["25m"]: width 512, 8
# layers, 8 heads of 64) on WikiText-2, on one GPU, in one call of under 10 minutes (docs/results.md).
#
#   bash training/gpu_quality.sh [--quick] [OUTPUT_DIR]      (OUTPUT_DIR: runs/gpu_quality)
#
# Both models see the same data at T = 512, B = 32 (16,384 tokens a step), the same Adam schedule and the same
# number of epochs, in mixed_bfloat16 (XLA, Keras' default on a GPU), with dropout 0.1 (both overfit WikiText-2
# at this size without it). One SentencePiece model serves every run: a first tiny run trains it, every run
# reuses it (--tokenizer-from), so the data is tokenized once. The runs go seed by seed, every model's first
# seed before any second one, and ELITA_GPU_BUDGET_S (default 540) skips a run that would end past the budget,
# never a model's first seed. It writes OUTPUT_DIR/ELiTA.png (the curves), OUTPUT_DIR/results.md (validation
# and test loss, step time, peak memory, mean ± sample sd over the seeds) and results.json.
#
# WikiText-2 is read from ELITA_WIKITEXT_DIR (a lent machine has no internet: copy ../shared/data/wikitext-2 into
# the working tree, e.g. .wikitext-2/, carry it, and point ELITA_WIKITEXT_DIR there). --quick runs the same path
# at a toy size, a few steps a run, on a CPU (CI runs it, so the command cannot break unseen);
# ELITA_VOCABULARY_SIZE sets its vocabulary (default 512).
set -euo pipefail
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
out="${1:-runs/gpu_quality}"
python="${PYTHON:-python3}"
budget="${ELITA_GPU_BUDGET_S:-540}"
start=$(date +%s)

if [ $quick = 1 ]; then
  # WikiText-2 has 276 distinct characters, and a tiny corpus (the test's) too few pieces for 512: it sets this.
  vocabulary="${ELITA_VOCABULARY_SIZE:-512}"
  model=(--size seed --hidden-dim 16 --num-layers 1 --num-heads 2 --head-dim 8)
  schedule=(--sequence-length 32 --batch-size 8 --epochs 1 --max-steps 3 --eval-batches 2)
else
  vocabulary=5000
  model=(--size 25m)
  schedule=(--sequence-length 512 --batch-size 32 --epochs 10 --dropout 0.1)
fi
common=(--dtype-policy mixed_bfloat16 --checkpoint-every 1000000 --keep-checkpoints 1 --verbose 2)

# The shared tokenizer: one step of the smallest model, whose run directory every run then reads it from.
tokenizer="$out/tokenizer"
"$python" -m elita_tf.cli.train --output-dir "$tokenizer" --architecture linear --size seed --num-layers 1 \
  --max-steps 1 --eval-batches 1 --verbose 0 --vocabulary-size "$vocabulary" --sequence-length 32 --batch-size 8

left=$(( budget - ($(date +%s) - start) ))
"$python" -m elita_tf.cli.compare --architectures elita transformer --seeds 0 1 2 --output-dir "$out" \
  --budget-seconds "$left" --tokenizer-from "$tokenizer" "${model[@]}" "${schedule[@]}" "${common[@]}"

#!/usr/bin/env bash
# The long-context study (docs/long-context.md) on WikiText-2: ELiTA trained at T = 256, 4096 and 16384 (32768 tokens a
# step, as the seed configuration), ELiTA trained at T = 256 with --carry-state, and the Transformer
# (TRANSFORMER_SEQ_LEN, default 256, at the same tokens a step: 2048 is the longest that fits in 24 GB, about
# 13 GB at its peak and 4-5.5 s a step on a 2-core CPU); then each scored on the test split by position, in
# sequences of up to 16K tokens (and ELiTA at 256 in its own sequences too), ELiTA's fixed-position runs also
# with clamped positions (the same weights), and ELiTA's runs over the whole split as one stream. Finished
# steps are skipped.
# Offline: export ELITA_WIKITEXT_DIR=path/to/wikitext-2 first.
set -euo pipefail
out="${1:-runs/long_context}"
transformer_len="${TRANSFORMER_SEQ_LEN:-256}"

train() {  # train DIR ARGS...: one run, unless it has finished
  local dir="$1"
  shift
  [ -f "$dir/results.json" ] || elita-train --epochs 2 --seed 0 --checkpoint-every 20 --verbose 2 --output-dir "$dir" "$@"
}
score() {  # score DIR FILE ARGS...: one evaluation on the test split, unless written
  local dir="$1" file="$2"
  shift 2
  [ -f "$dir/$file" ] || elita-evaluate --run-dir "$dir" --split test --output "$dir/$file" "$@" > /dev/null
}

# The reference's positions (a new run's default clamps them past T): each run is then also scored clamped.
train "$out/elita-256" --architecture elita --sequence-length 256 --batch-size 128 --position-mode fixed
train "$out/elita-256-carry" --architecture elita --sequence-length 256 --batch-size 128 --carry-state --position-mode fixed
train "$out/elita-4096" --architecture elita --sequence-length 4096 --batch-size 8 --position-mode fixed
train "$out/elita-16384" --architecture elita --sequence-length 16384 --batch-size 2 --position-mode fixed
train "$out/transformer-$transformer_len" --architecture transformer --sequence-length "$transformer_len" \
  --batch-size $((32768 / transformer_len))

for run in elita-256 elita-256-carry elita-4096 elita-16384; do
  score "$out/$run" test-sequences.json --sequence-length 16384 --batch-size 2
  score "$out/$run" test-stream.json --sequence-length 16384 --carry-state
done
for run in elita-256 elita-4096; do
  score "$out/$run" test-sequences-clamped.json --sequence-length 16384 --batch-size 2 --position-mode clamped
done
score "$out/elita-256" test-stream-clamped.json --sequence-length 16384 --carry-state --position-mode clamped
score "$out/elita-256" test-sequences-256.json
# Learned positions stop at the training length: the Transformer is scored in its own sequences.
score "$out/transformer-$transformer_len" test-sequences.json

python training/plot_long_context.py "$out" --output docs/long_context.png

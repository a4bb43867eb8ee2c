#!/usr/bin/env bash
# The README's long-context results on WikiText-2: ELiTA trained at T = 256, 4096 and 16384 (32768 tokens a
# step, as the seed configuration), ELiTA trained at T = 256 with --carry-state, and the Transformer at the
# longest T that fits this machine's memory; then each scored on the test split by position, up to 16K
# tokens, and ELiTA's runs over the whole split as one stream. Finished runs resume as finished.
# Offline: export ELITA_WIKITEXT_DIR=path/to/wikitext-2 first.
set -euo pipefail
out="${1:-runs/long_context}"
transformer_len="${TRANSFORMER_SEQ_LEN:-1024}"
common=(--preset elita --epochs 2 --seed 0 --checkpoint-every 20 --verbose 2)

elita-train "${common[@]}" --seq-len 256 --batch-size 128 --output-dir "$out/elita-256"
elita-train "${common[@]}" --seq-len 256 --batch-size 128 --carry-state --output-dir "$out/elita-256-carry"
elita-train "${common[@]}" --seq-len 4096 --batch-size 8 --output-dir "$out/elita-4096"
elita-train "${common[@]}" --seq-len 16384 --batch-size 2 --output-dir "$out/elita-16384"
elita-train --preset transformer --epochs 2 --seed 0 --checkpoint-every 20 --verbose 2 \
  --seq-len "$transformer_len" --batch-size $((32768 / transformer_len)) --output-dir "$out/transformer-$transformer_len"

for run in elita-256 elita-256-carry elita-4096 elita-16384; do
  elita-evaluate --run-dir "$out/$run" --split test --context-length 16384 --batch-size 2 \
    --output "$out/$run/test-windows.json"
  elita-evaluate --run-dir "$out/$run" --split test --context-length 16384 --carry-state \
    --output "$out/$run/test-stream.json"
done
# Learned positions stop at the training length: the Transformer is scored in its own windows.
elita-evaluate --run-dir "$out/transformer-$transformer_len" --split test --output "$out/transformer-$transformer_len/test-windows.json"

python training/plot_long_context.py "$out" --output long_context.png

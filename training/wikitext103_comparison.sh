#!/usr/bin/env bash
# ELiTA against the Transformer on one epoch of WikiText-103 (about 4,300 steps of 128 x 256 tokens,
# the learning rate decaying to about 1.5e-4): most likely the regime of the ELiTA reference's plot.
# Not run in this project: its machines hold WikiText-2 only. Downloads by default.
set -euo pipefail
out="${1:-runs/wikitext103}"
elita-compare --architectures elita transformer --seeds 0 --data wikitext-103-v1 --output-dir "$out" \
  --epochs 1 --checkpoint-every 100 --verbose 2 --plot "$out/ELiTA_wikitext103.png"

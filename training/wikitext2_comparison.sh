#!/usr/bin/env bash
# The WikiText-2 results (docs/results.md): the seven architectures, three seeds each, trained one after the other
# (take them on an otherwise idle machine: every results.json records the load average it saw).
# Finished runs are skipped, so the second command only redraws ELiTA.png from the same runs.
# Offline: export ELITA_WIKITEXT_DIR=path/to/wikitext-2 first.
set -euo pipefail
out="${1:-runs/wikitext2}"
common=(--seeds 0 1 2 --output-dir "$out" --epochs 2 --checkpoint-every 20 --verbose 2)
elita-compare --architectures elita transformer simplified simplified-wide linear 3lin additive "${common[@]}" \
  --plot "$out/all_architectures.png"
elita-compare --architectures elita transformer "${common[@]}" --plot ELiTA.png

#!/usr/bin/env bash
# ElitaCausalLM.generate ms/token, a previous checkout against the current one, rounds alternating.
# Nothing else running. PREVIOUS and CURRENT: clean checkouts (PREVIOUS's decoding.py takes --presets, the
# flag's name before --architectures); PYTHON: an environment with the package's dependencies.
#
#   PREVIOUS=../old CURRENT=. bash benchmarks/decoding_rounds.sh [OUTPUT_DIR]   (OUTPUT_DIR: benchmarks/results/decoding_rounds)
#
# It writes OUTPUT_DIR/old-ROUND.txt (PREVIOUS) and OUTPUT_DIR/new-ROUND.txt (CURRENT), two rounds.
set -u
export TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python}
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/benchmarks/results/decoding_rounds}" && cd "${1:-$root/benchmarks/results/decoding_rounds}" && pwd)"
previous="$(cd "${PREVIOUS:?a clean checkout of the previous commit}" && pwd)"
current="$(cd "${CURRENT:?a clean checkout of the current commit}" && pwd)"
for round in 1 2; do
  (cd "$previous/benchmarks" && PYTHONPATH="$previous" $py decoding.py --presets elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > "$out/old-$round.txt" 2>&1
  (cd "$current/benchmarks" && PYTHONPATH="$current" $py decoding.py --architectures elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > "$out/new-$round.txt" 2>&1
done

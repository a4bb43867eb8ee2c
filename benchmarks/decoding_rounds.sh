#!/usr/bin/env bash
# ElitaCausalLM.generate ms/token, a previous checkout against the current one, rounds alternating.
# Nothing else running. PREVIOUS and CURRENT: clean checkouts (a PREVIOUS before 25e50bf names the models
# --presets); PYTHON: an environment with the package's dependencies.
#
#   PREVIOUS=../old CURRENT=. bash benchmarks/decoding_rounds.sh [OUTPUT_DIR]   (OUTPUT_DIR: runs/decoding_rounds)
#
# It writes OUTPUT_DIR/old-ROUND.txt (PREVIOUS) and OUTPUT_DIR/new-ROUND.txt (CURRENT), two rounds.
set -u
export TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python}
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/runs/decoding_rounds}" && cd "${1:-$root/runs/decoding_rounds}" && pwd)"
previous="$(cd "${PREVIOUS:?a clean checkout of the previous commit}" && pwd)"
current="$(cd "${CURRENT:?a clean checkout of the current commit}" && pwd)"
flag=--architectures
grep -q -- '"--presets"' "$previous/benchmarks/decoding.py" && flag=--presets
for round in 1 2; do
  (cd "$previous/benchmarks" && PYTHONPATH="$previous" $py decoding.py $flag elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > "$out/old-$round.txt" 2>&1
  (cd "$current/benchmarks" && PYTHONPATH="$current" $py decoding.py --architectures elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > "$out/new-$round.txt" 2>&1
done

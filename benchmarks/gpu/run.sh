#!/usr/bin/env bash
# Every GPU figure the docs quote, as one prepared command: the correctness check, ELiTA's training step
# against the Transformer's (seed and 25M sizes, T = 2048 and 8192, XLA, float32 and mixed_bfloat16, then the
# same with XLA's command buffers also taking conditionals and loops), and the layers at T = 16K.
#
#   bash benchmarks/gpu/run.sh [--quick] [OUTPUT_DIR]      (from anywhere; OUTPUT_DIR: benchmarks/gpu/results)
#
# It writes OUTPUT_DIR/raw.jsonl (one JSON line per measurement, appended as each ends), OUTPUT_DIR/log.txt
# (each benchmark's own table) and prints the summary table (benchmarks/gpu/summary.py). The most important
# settings run first, and a measurement that could end past ELITA_GPU_BUDGET_S seconds is
# skipped, not started, so a lent GPU's time limit cuts the least important figures (its default, 450,
# leaves an 8-minute call room for the last measurement). --quick runs the same
# steps at toy sizes in about a minute on a CPU: CI runs it, so the script cannot break unseen.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
quick=0
if [ "${1:-}" = "--quick" ]; then quick=1; shift; fi
out="$(mkdir -p "${1:-$root/benchmarks/gpu/results}" && cd "${1:-$root/benchmarks/gpu/results}" && pwd)"
python="${PYTHON:-python3}"
raw="$out/raw.jsonl"
log="$out/log.txt"
: > "$raw"
: > "$log"
cd "$root/benchmarks"
deadline=$(( $(date +%s) + ${ELITA_GPU_BUDGET_S:-450} ))
# XLA's GPU command buffers by default, plus conditionals and loops (flags are GPU-only; a CPU ignores them).
command_buffers="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"
# Autotuning results kept per fusion and shared by every process: a setting measured again with other flags
# (the command buffers) autotunes nothing twice. It changes no kernel XLA picks, only when it picks it.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=${TMPDIR:-/tmp}/elita-xla-autotune"

if [ $quick = 1 ]; then
  check=(--quick)
  size_flags=(--num-layers 1 --hidden-dim 32 --num-heads 2 --head-dim 16 --vocabulary-size 500)
  lengths=(32)
  step=(--tokens 64 --repeats 1 --timeout 60)
  layer=(--sequence-lengths 64 --tokens 128 --heads 2 --head-dim 16 --width 32 --repeats 1 --timeout 60)
  sizes=(seed)
else
  check=()
  size_flags=()
  lengths=(8192 2048)
  step=(--tokens 16384 --repeats 5 --timeout 150)
  layer=(--sequence-lengths 16384 --tokens 32768 --quadratic-max-len 16384 --repeats 10 --timeout 120)
  sizes=(25m seed)
fi

check() { "$python" gpu/check.py "${check[@]}" --out "$raw" 2>>"$log.check" >"$log.check.out"; }
steps() {  # steps SIZE DTYPE_POLICY [XLA_FLAGS]
  XLA_FLAGS="$(echo ${XLA_FLAGS:-} ${3:-})" "$python" training_step.py --size "$1" "${size_flags[@]}" --jit-compile \
    --dtype-policy "$2" --sequence-lengths "${lengths[@]}" "${step[@]}" --deadline "$deadline" --out "$raw"
}
layers() {
  if [ $(( $(date +%s) + 120 )) -le $deadline ]; then
    "$python" layers.py --xla --subjects kernel attention2 mha "${layer[@]}" --out "$raw"
  else
    echo "layers: skipped, past the deadline"
  fi
}

if [ $quick = 1 ]; then  # each setting once, two at a time: the script's every path, in about a minute
  check & steps seed mixed_bfloat16 >"$log.1" 2>&1 & wait
  steps seed float32 "$command_buffers" >"$log.2" 2>&1 & layers >"$log.3" 2>&1 & wait
  cat "$log.check.out" "$log.check" "$log.1" "$log.2" "$log.3" >>"$log" && rm "$log".*
  grep -q "all .* checks passed" "$log" || { cat "$log"; exit 1; }
else  # one at a time, the goal's figures first
  check; cat "$log.check.out" "$log.check" >>"$log"; rm "$log".*
  for size in "${sizes[@]}"; do steps "$size" mixed_bfloat16 2>>"$log" | tee -a "$log"; done
  for size in "${sizes[@]}"; do steps "$size" mixed_bfloat16 "$command_buffers" 2>>"$log" | tee -a "$log"; done
  layers 2>>"$log" | tee -a "$log"
  for size in "${sizes[@]}"; do steps "$size" float32 2>>"$log" | tee -a "$log"; done
  for size in "${sizes[@]}"; do steps "$size" float32 "$command_buffers" 2>>"$log" | tee -a "$log"; done
fi

echo
"$python" gpu/summary.py "$raw" | tee "$out/summary.md"

#!/usr/bin/env bash
# The layers on JAX and PyTorch, on a lent GPU without TensorFlow, beside PyTorch's own attention ops: one
# prepared command, most important first.
#   1. Attention2 and its kernel (`causal_softmax_mean`), forward and forward+backward, at the 25M size's shapes
#      (B = 2, T = 8192, H = 8, D = 64, width 512, mixed_bfloat16): on JAX (jax.jit) and PyTorch (eager);
#   2. SDPA causal (FlashAttention-2) and fla's chunk_linear_attn at the same shapes (torch_gpt.py ops);
#   3. JAX at the shapes of TensorFlow's H200 run of 2026-11-26 (float32, T = 16384, B = 2, H = 4, D = 64,
#      width 256: kernel, elementwise pass, Attention2, MultiHeadAttention), for a like-for-like reading of that
#      run's TensorFlow table (benchmarks/results/h200-2026-11-26/layers_xla_16k.log);
#   4. the same on PyTorch; then T = 65536 on JAX.
#
#   bash benchmarks/gpu/backends.sh [--quick] [OUTPUT_DIR]      (OUTPUT_DIR: benchmarks/gpu/results)
#
# Keras (and its two packages the image lacks, namex and optree) travel as wheels in .whl (README.md of the
# device tool); fla's wheels in benchmarks/gpu/wheels (fetch_wheels.sh), installed for the PyTorch processes.
# Every measurement ends by ELITA_GPU_BUDGET_S seconds after the start (default 480). --quick runs the same
# steps at toy sizes on a CPU.
set -uo pipefail
source "$(dirname "$0")/arguments.sh" "$@"
raw="$out/backends.jsonl"
log="$out/backends.txt"
: > "$raw"
: > "$log"
cd "$root/benchmarks"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deadline=$(( $(date +%s) + ${ELITA_GPU_BUDGET_S:-480} ))
fla_site="${TMPDIR:-/tmp}/elita-fla-site"
if compgen -G "$root/benchmarks/gpu/wheels/*.whl" >/dev/null \
  && "$python" -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$fla_site" \
    "$root"/benchmarks/gpu/wheels/*.whl >>"$log" 2>&1; then
  torch_path="$fla_site:$PYTHONPATH"
else
  torch_path="$PYTHONPATH"
fi

if [ "$quick" = 1 ]; then
  small=(--sequence-lengths 64 --tokens 128 --heads 2 --head-dim 16 --width 32 --repeats 1 --timeout 300)
  big=(--sequence-lengths 128 --tokens 128 --heads 2 --head-dim 16 --width 32 --repeats 1 --timeout 300)
  ops=(--sequence-lengths 64 --tokens 128 --heads 2 --head-dim 16 --repeats 1 --timeout 120)
  long=()
else
  small=(--sequence-lengths 8192 --tokens 16384 --heads 8 --head-dim 64 --width 512 --repeats 10 --timeout 150)
  big=(--sequence-lengths 16384 --tokens 32768 --heads 4 --head-dim 64 --width 256 --repeats 10 --timeout 150)
  ops=(--sequence-lengths 8192 --tokens 16384 --heads 8 --head-dim 64 --repeats 10 --timeout 120)
  long=(--sequence-lengths 65536 --tokens 65536 --heads 8 --head-dim 64 --width 512 --repeats 5 --timeout 150)
fi
layers() { "$python" layers.py --deadline "$deadline" --out "$raw" "$@" 2>&1 | tee -a "$log"; }

echo "## 1. Attention2 and its kernel at the 25M shapes, mixed_bfloat16" | tee -a "$log"
layers --backends jax torch --dtype-policy mixed_bfloat16 --subjects kernel attention2 "${small[@]}"
echo "## 2. PyTorch's attention ops at the same shapes, bfloat16" | tee -a "$log"
PYTHONPATH="$torch_path" "$python" gpu/torch_gpt.py ops --subjects sdpa fla "${ops[@]}" --deadline "$deadline" \
  --out "$raw" 2>&1 | tee -a "$log"
echo "## 3. JAX at the shapes of TensorFlow's H200 table of 2026-11-26, float32" | tee -a "$log"
layers --backends jax --subjects kernel elementwise attention2 mha "${big[@]}"
echo "## 4. PyTorch at those shapes; JAX at T = 65536" | tee -a "$log"
layers --backends torch --subjects kernel elementwise attention2 mha "${big[@]}"
if [ "${#long[@]}" -gt 0 ]; then
  layers --backends jax --dtype-policy mixed_bfloat16 --subjects kernel attention2 "${long[@]}"
fi
echo "done: $raw" | tee -a "$log"

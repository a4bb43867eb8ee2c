#!/usr/bin/env bash
# Every GPU figure the docs quote, as one prepared command, most important first: the correctness check; ELiTA's
# XLA training step (25M, mixed_bfloat16) on TensorFlow and on JAX against a PyTorch GPT of the Transformer's shape
# (SDPA causal, bfloat16 autocast, fused AdamW, torch.compile'd) at T = 8192 and 2048, and ELiTA's and the
# Transformer's Keras step on PyTorch (eager) there, each backend's peak memory beside; the profile of the JAX step
# on the GPU's timeline; the attention ops alone at T = 8192 (Attention2 and its kernel against SDPA and fla's
# chunk_linear_attn); the TensorFlow step's profile; T = 32768 steps and T = 65536 ops; the GPT eager; then ELiTA
# against the Keras Transformer at 25M (both backends) and the seed size, in float32, and with XLA's command
# buffers also taking conditionals and loops.
#
#   bash benchmarks/gpu/run.sh [--quick] [OUTPUT_DIR]      (from anywhere; OUTPUT_DIR: benchmarks/gpu/results)
#
# PYTHON runs the TensorFlow side, JAX_PYTHON the same training step and profile on JAX (KERAS_BACKEND=jax,
# without TensorFlow), TORCH_PYTHON (a Python with PyTorch and without TensorFlow) the PyTorch side; all default to
# python3. Wheels in benchmarks/gpu/wheels (fetch_wheels.sh) are installed into scratch folders that only their
# side sees: fla's for PyTorch, Keras' and keras-hub's (wheels/jax) for JAX and for Keras on PyTorch. A side whose Python lacks its
# framework is reported skipped, so a machine without TensorFlow still measures JAX against PyTorch.
#
# It writes OUTPUT_DIR/raw.jsonl (one JSON line per measurement, appended as each ends), OUTPUT_DIR/log.txt (each
# benchmark's own table) and OUTPUT_DIR/summary.md (benchmarks/gpu/summary.py: the ratios and the goals). Every
# measurement ends by ELITA_GPU_BUDGET_S seconds after the start (default 540) and none starts in its last
# minute, so a lent GPU's 10-minute call cuts the least important figures, never the summary. --quick runs the
# same steps at toy sizes on a CPU in about two minutes (CI runs it, so the script cannot break unseen):
# torch.compile and fla, which need CUDA, are reported skipped, and without PyTorch the PyTorch side is.
set -euo pipefail
source "$(dirname "$0")/arguments.sh" "$@"
torch_python="${TORCH_PYTHON:-python3}"
raw="$out/raw.jsonl"
log="$out/log.txt"
: > "$raw"
: > "$log"
cd "$root/benchmarks"
deadline=$(( $(date +%s) + ${ELITA_GPU_BUDGET_S:-540} ))
# XLA's GPU command buffers by default, plus conditionals and loops (flags are GPU-only; a CPU ignores them).
command_buffers="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"
# Autotuning results kept per fusion and shared by every process: a setting measured again with other flags
# (the command buffers) autotunes nothing twice. It changes no kernel XLA picks, only when it picks it.
export XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_per_fusion_autotune_cache_dir=${TMPDIR:-/tmp}/elita-xla-autotune"

skip_side() {  # skip_side NAME REASON: a side whose framework does not import, in the log and the summary
  echo "$1: skipped, $2" | tee -a "$log"
  echo "{\"skipped\": \"$1\", \"reason\": \"$2\"}" >> "$raw"
}

# The PyTorch side: its own Python, without TensorFlow's folders on its paths (setup_tensorflow.sh keeps the
# library path it found), fla from the carried wheels.
torch_env=(env -u PYTHONPATH)
if [ -n "${ELITA_LD_LIBRARY_PATH+set}" ]; then torch_env+=(LD_LIBRARY_PATH="$ELITA_LD_LIBRARY_PATH"); fi
if "${torch_env[@]}" "$torch_python" -c "import torch" 2>/dev/null; then
  wheels="${ELITA_FLA_WHEELS:-$root/benchmarks/gpu/wheels}"
  if compgen -G "$wheels/*.whl" >/dev/null; then
    fla_site="${TMPDIR:-/tmp}/elita-fla-site"
    if "${torch_env[@]}" "$torch_python" -m pip install -q --no-deps --no-index --no-compile --upgrade --target "$fla_site" \
      "$wheels"/*.whl >>"$log" 2>&1; then
      torch_env+=(PYTHONPATH="$fla_site")
    fi
  fi
  torch=1
else
  torch=0
  skip_side pytorch "torch does not import in $torch_python"
fi

source "$(dirname "$0")/jax_side.sh"
if "${jax_env[@]}" "$jax_python" -c "import jax, keras_hub" 2>/dev/null; then jax=1; else
  jax=0; skip_side jax "jax or keras-hub does not import in $jax_python"
fi
# Keras on PyTorch (ELiTA's and the Transformer's step, eager): the PyTorch Python, with the JAX side's Keras and
# keras-hub, without TensorFlow.
keras_torch_env=("${jax_env[@]/KERAS_BACKEND=jax/KERAS_BACKEND=torch}")
if [ $torch = 1 ] && "${keras_torch_env[@]}" "$torch_python" -c "import torch, keras_hub" 2>/dev/null; then
  keras_torch=1
else
  keras_torch=0; skip_side keras-torch "torch or keras-hub does not import in $torch_python"
fi
if "$python" -c "import tensorflow" 2>/dev/null; then tf=1; else
  tf=0; skip_side tensorflow "tensorflow does not import in $python"
fi

if [ $quick = 1 ]; then
  check=(--quick)
  size_flags=(--num-layers 1 --hidden-dim 32 --num-heads 2 --head-dim 16 --vocabulary-size 500)
  step=(--tokens 64 --repeats 1 --timeout 120)
  ops=(--heads 2 --head-dim 16 --repeats 1 --timeout 120)
  layer=(--width 32 "${ops[@]}")
  profile=(--size seed "${size_flags[@]}" --sequence-length 32 --batch-size 2 --warmup 2 --steps 2)
else
  check=()
  size_flags=()
  step=(--tokens 16384 --repeats 5 --timeout 150)
  ops=(--heads 8 --head-dim 64 --repeats 10 --timeout 120)
  layer=(--width 512 "${ops[@]}")
  profile=(--size 25m --sequence-length 8192 --batch-size 2 --warmup 2 --steps 5)
fi

side() {  # side tf|jax|torch: sets $runner to that side's command, or fails where that side was skipped
  if [ "$1" = jax ]; then
    [ $jax = 1 ] && runner=("${jax_env[@]}" "$jax_python")
  elif [ "$1" = torch ]; then
    [ $keras_torch = 1 ] && runner=("${keras_torch_env[@]}" "$torch_python")
  else
    [ $tf = 1 ] && runner=(env KERAS_BACKEND=tensorflow "$python")
  fi
}
check() { side tf || return 0; "${runner[@]}" gpu/check.py "${check[@]}" --out "$raw"; }
steps() {  # steps tf|jax|torch SIZE DTYPE_POLICY "ARCHITECTURES" "LENGTHS" [XLA_FLAGS]: the training step,
  # compiled (XLA), or eager on PyTorch, where torch.compile of Keras' step costs more than it saves on a CPU
  side "$1" || return 0
  local compile=(--jit-compile)
  [ "$1" = torch ] && compile=()
  XLA_FLAGS="$(echo ${XLA_FLAGS:-} ${6:-})" "${runner[@]}" training_step.py --size "$2" "${size_flags[@]}" \
    "${compile[@]}" --dtype-policy "$3" --architectures $4 --sequence-lengths $5 "${step[@]}" --deadline "$deadline" \
    --out "$raw"
}
gpt() {  # gpt SIZE "LENGTHS" "MODES": the PyTorch GPT, torch.compile'd and/or eager
  [ $torch = 1 ] || return 0
  "${torch_env[@]}" "$torch_python" gpu/torch_gpt.py steps --size "$1" "${size_flags[@]}" --modes $3 \
    --sequence-lengths $2 "${step[@]}" --timeout 240 --deadline "$deadline" --out "$raw"
}
layers() {  # layers T TOKENS: Attention2 and its kernel, XLA, mixed_bfloat16
  side tf || return 0
  "${runner[@]}" layers.py --xla --dtype-policy mixed_bfloat16 --subjects kernel-factored kernel-direct attention2 \
    --sequence-lengths "$1" --tokens "$2" "${layer[@]}" --deadline "$deadline" --out "$raw"
}
attention_ops() {  # attention_ops T TOKENS: SDPA causal and fla, bfloat16
  [ $torch = 1 ] || return 0
  "${torch_env[@]}" "$torch_python" gpu/torch_gpt.py ops --subjects sdpa fla \
    --sequence-lengths "$1" --tokens "$2" "${ops[@]}" --deadline "$deadline" --out "$raw"
}
data_parallel() {  # data_parallel SIZE T: ELiTA's JAX step on one device and data parallel over all of a machine's GPUs
  # (over 2 host devices in the quick run, where that shows the path, not a speed-up)
  side jax || return 0
  local devices=2
  if [ $quick = 0 ]; then
    devices=$("${runner[@]}" -c "import jax; print(len(jax.devices('gpu')))" 2>/dev/null || echo 0)
    if [ "${devices:-0}" -lt 2 ]; then echo "data parallel: skipped, ${devices:-0} GPU(s)"; return; fi
  fi
  "${runner[@]}" training_step.py --backends jax --size "$1" "${size_flags[@]}" --dtype-policy mixed_bfloat16 \
    --architectures elita --sequence-lengths "$2" --devices 1 "$devices" "${step[@]}" --deadline "$deadline" --out "$raw"
}
profile() {  # profile tf|jax: where ELiTA's XLA step goes on the GPU's timeline (the host's without a GPU)
  side "$1" || return 0
  local left=$(( deadline - $(date +%s) ))
  if [ $left -lt 90 ]; then echo "profile $1: skipped, past the deadline"; return; fi
  timeout $(( left < 240 ? left : 240 )) "${runner[@]}" profile_step.py --jit-compile \
    --dtype-policy mixed_bfloat16 "${profile[@]}" --top 20 --out "$raw" || echo "profile $1: failed (exit status $?)"
}

if [ $quick = 1 ]; then  # every function once, in two lanes: the script's every path, in about two minutes
  {
    check
    steps tf seed mixed_bfloat16 "elita transformer" 32
    steps jax seed mixed_bfloat16 "elita transformer" 32
    layers 64 128
    data_parallel seed 32
  } >"$log.1" 2>&1 &
  {
    gpt seed 32 "compiled eager"
    steps torch seed mixed_bfloat16 "elita transformer" 32
    attention_ops 64 128
    profile tf
    profile jax
    steps tf seed float32 "elita transformer" 32 "$command_buffers"
  } >"$log.2" 2>&1 &
  wait
  cat "$log.1" "$log.2" >>"$log" && rm "$log".*
  [ $tf = 0 ] || grep -q "all .* checks passed" "$log" || { cat "$log"; exit 1; }
else  # one at a time, the goals' figures first
  run() { "$@" 2>>"$log" | tee -a "$log" || echo "$1: exit status $?" | tee -a "$log"; }
  run check
  run steps tf 25m mixed_bfloat16 elita 8192
  run steps jax 25m mixed_bfloat16 elita 8192
  run gpt 25m 8192 compiled
  run steps tf 25m mixed_bfloat16 elita 2048
  run steps jax 25m mixed_bfloat16 elita 2048
  run gpt 25m 2048 compiled
  run steps torch 25m mixed_bfloat16 "elita transformer" "8192 2048"
  run profile jax
  run layers 8192 16384
  run attention_ops 8192 16384
  run profile tf
  run steps tf 25m mixed_bfloat16 elita 32768
  run steps jax 25m mixed_bfloat16 elita 32768
  run gpt 25m 32768 compiled
  run layers 65536 65536
  run attention_ops 65536 65536
  run gpt 25m "8192 2048 32768" eager
  run steps tf 25m mixed_bfloat16 transformer "8192 2048"
  run steps jax 25m mixed_bfloat16 transformer "8192 2048"
  run steps tf seed mixed_bfloat16 "elita transformer" "8192 2048"
  run steps tf 25m float32 "elita transformer" "8192 2048"
  run steps tf 25m mixed_bfloat16 "elita transformer" "8192 2048" "$command_buffers"
  run data_parallel 25m 2048
fi

echo
"$python" gpu/summary.py "$raw" | tee "$out/summary.md"

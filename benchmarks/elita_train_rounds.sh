#!/usr/bin/env bash
# elita-train at the seed configuration, 8 steps, float32: ELiTA at a previous checkout ($PREVIOUS),
# ELiTA and the Transformer at the current one ($CURRENT), rounds alternating. Nothing else running.
# PREVIOUS and CURRENT: clean checkouts (a PREVIOUS before 25e50bf names the model --preset); PYTHON: an
# environment with the package's dependencies.
#
#   PREVIOUS=../old CURRENT=. bash benchmarks/elita_train_rounds.sh [OUTPUT_DIR]   (OUTPUT_DIR: runs/elita_train_rounds)
#
# Each process's run directory and log go under OUTPUT_DIR; the summary (step time, peak memory, load
# average and commit of each process) is printed.
set -u
export ELITA_WIKITEXT_DIR=${ELITA_WIKITEXT_DIR:?the WikiText-2 directory} TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python}
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$root/runs/elita_train_rounds}" && cd "${1:-$root/runs/elita_train_rounds}" && pwd)"
previous="$(cd "${PREVIOUS:?a clean checkout of the previous commit}" && pwd)"
current="$(cd "${CURRENT:?a clean checkout of the current commit}" && pwd)"
flag=--architecture
grep -q '"preset": ' "$previous/elita_tf/cli/train.py" && flag=--preset
cd /tmp  # python -m puts the working directory first on sys.path, before PYTHONPATH
for round in 1 2 3; do
  PYTHONPATH="$previous" $py -m elita_tf.cli.train $flag elita --output-dir "$out/old-elita-$round" \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > "$out/old-elita-$round.log" 2>&1
  PYTHONPATH="$current" $py -m elita_tf.cli.train --architecture elita --output-dir "$out/new-elita-$round" \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > "$out/new-elita-$round.log" 2>&1
  PYTHONPATH="$current" $py -m elita_tf.cli.train --architecture transformer --output-dir "$out/new-transformer-$round" \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > "$out/new-transformer-$round.log" 2>&1
done
OUT="$out" $py - <<'PY'
import glob, json, os
for path in sorted(glob.glob(os.path.join(os.environ["OUT"], "*", "results.json"))):
    r = json.load(open(path))
    print(os.path.basename(os.path.dirname(path)), f"step {r['step_time_s']:.3f} s", f"peak {r['peak_memory_mib']:.0f} MiB",
          f"load {r['load_average']['mean']:.2f}/{r['load_average']['max']:.2f}", r["software"]["commit"])
PY

#!/usr/bin/env bash
# The README's "Multiple machines" figures: the same ELiTA run (the seed configuration, a few steps)
# in one process, then as a cluster of two worker processes on this machine (TF_CONFIG on
# 127.0.0.1). Both workers share this machine's cores, so this shows that the cluster trains the
# same run, not a speed-up. Offline: export ELITA_WIKITEXT_DIR=path/to/wikitext-2 first.
set -euo pipefail
out="${1:-runs/workers}"
steps="${STEPS:-20}"
ports=(${PORTS:-23456 23457})
mkdir -p "$out"
common=(--architecture elita --max-steps "$steps" --eval-batches 4 --verbose 0 --force-new)

elita-train "${common[@]}" --output-dir "$out/one-process" > "$out/one-process.log" 2>&1

cluster="\"worker\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\"]"
for index in 0 1; do
  TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"worker\", \"index\": $index}}" \
    elita-train "${common[@]}" --output-dir "$out/two-workers" --strategy multiworker \
    > "$out/worker-$index.log" 2>&1 &
done
wait

python - "$out" <<'PY'
import csv, json, sys
for name in ["one-process", "two-workers"]:
    run = f"{sys.argv[1]}/{name}"
    results = json.load(open(f"{run}/results.json"))
    losses = [float(row["loss"]) for row in csv.DictReader(open(f"{run}/steps.csv"))]
    print(f"{name}: replicas {results['replicas']}, step {results['step_time_s']:.3f} s, "
          f"{results['tokens_per_s']:.0f} tokens/s, loss at step {len(losses)} {losses[-1]:.4f}, "
          f"test loss {results['test_loss']:.4f}, load {results['load_average']['mean']:.2f}")
PY

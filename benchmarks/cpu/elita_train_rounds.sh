#!/usr/bin/env bash
# elita-train at the seed configuration, 8 steps, float32: ELiTA at the previous commit ($PREVIOUS),
# ELiTA and the Transformer at this one ($CURRENT), rounds alternating. Nothing else running.
# PREVIOUS and CURRENT: clean checkouts; PYTHON: an environment with the package's dependencies.
set -u
cd /tmp  # python -m puts the working directory first on sys.path, before PYTHONPATH
export ELITA_WIKITEXT_DIR=${ELITA_WIKITEXT_DIR:?the WikiText-2 directory} TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python}
out=${OUT:-runs/elita_train_rounds}
mkdir -p $out
for round in 1 2 3; do
  PYTHONPATH=$PREVIOUS $py -m elita_tf.cli.train --preset elita --output-dir $out/old-elita-$round \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > $out/old-elita-$round.log 2>&1
  PYTHONPATH=$CURRENT $py -m elita_tf.cli.train --architecture elita --output-dir $out/new-elita-$round \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > $out/new-elita-$round.log 2>&1
  PYTHONPATH=$CURRENT $py -m elita_tf.cli.train --architecture transformer --output-dir $out/new-transformer-$round \
    --max-steps 8 --eval-batches 1 --force-new --verbose 0 > $out/new-transformer-$round.log 2>&1
done
$py - <<'PY'
import glob, json, os
for path in sorted(glob.glob(os.environ.get("OUT", "runs/elita_train_rounds") + "/*/results.json")):
    r = json.load(open(path))
    print(os.path.basename(os.path.dirname(path)), f"step {r['step_time_s']:.3f} s", f"peak {r['peak_memory_mib']:.0f} MiB",
          f"load {r['load_average']['mean']:.2f}/{r['load_average']['max']:.2f}", r["software"]["commit"])
PY

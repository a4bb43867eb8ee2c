#!/usr/bin/env bash
# ElitaCausalLM.generate ms/token, previous commit against this one, alternating. Nothing else running.
set -u
export TF_CPP_MIN_LOG_LEVEL=3
py=${PYTHON:-python}
out=${OUT:-runs/decoding_rounds}
mkdir -p $out
for round in 1 2; do
  (cd $PREVIOUS/benchmarks && PYTHONPATH=$PREVIOUS $py decoding.py --presets elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > $out/old-$round.txt 2>&1
  (cd $CURRENT/benchmarks && PYTHONPATH=$CURRENT $py decoding.py --architectures elita transformer \
    --contexts 256 4096 --steps 256 --repeats 5) > $out/new-$round.txt 2>&1
done

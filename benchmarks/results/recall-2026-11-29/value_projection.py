"""One recall cell of `simplified` with only the first block's learned value projection added.

`simplified-reference` differs from `simplified` in four ways (a learned value projection in the first
block, tied embeddings, RMSNorm, epsilon 1e-5) and recalls at width 64 where `simplified` does not.
This cell adds the first of them alone. Run from the repository root:

    TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1 taskset -c 1 \
        python benchmarks/results/recall-2026-11-29/value_projection.py > value_projection.log
"""

import os

from elita_tf.models.architectures import ARCHITECTURES
from elita_tf.training.recall import RecallSettings, train_cell, write_json

ARCHITECTURES["simplified-value-projection"] = {**ARCHITECTURES["simplified"], "first_value_projection": True}
record = train_cell("simplified-value-projection", 64, 64, 4, 1e-3, RecallSettings(), log=print)
path = os.path.join(os.path.dirname(__file__), "cells", "simplified-value-projection", "T64-P4", "w64-lr0.001.json")
write_json(path, record)
print(f"accuracy {record['accuracy']:.3f} in {record['steps']} steps")

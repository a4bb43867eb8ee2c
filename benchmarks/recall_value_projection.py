"""One recall cell of `simplified` with only the first block's learned value projection added.

`simplified-reference` differs from `simplified` in four ways (a learned value projection in the first
block, tied embeddings, RMSNorm, epsilon 1e-5) and recalls at width 64 where `simplified` does not.
This cell adds the first of them alone (`simplified-value-projection` in `docs/results.md`'s recall table), and
writes it where `elita-recall` writes its cells, under the directory given (default `runs/recall`):

    python benchmarks/recall_value_projection.py [OUTPUT_DIR]
"""

import sys

from elita_tf.models.architectures import ARCHITECTURES
from elita_tf.training.recall import RecallSettings, cell_path, train_cell, write_json

ARCHITECTURES["simplified-value-projection"] = {**ARCHITECTURES["simplified"], "first_value_projection": True}
record = train_cell("simplified-value-projection", 64, 64, 4, 1e-3, RecallSettings(), log=print)
output_dir = sys.argv[1] if len(sys.argv) > 1 else "runs/recall"
write_json(cell_path(output_dir, "simplified-value-projection", 64, 4, 64, 1e-3), record)
print(f"accuracy {record['accuracy']:.3f} in {record['steps']} steps")

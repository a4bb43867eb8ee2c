"""`evaluate`: the loss and perplexity of a trained model (a run directory or any preset) on a WikiText split.

    from elita_tf.training.evaluate import evaluate
    evaluate("runs/compare/elita/seed-0", split="test", quantize="int8")
    evaluate("runs/compare/elita/seed-0", split="test", litert="elita.tflite")  # the exported file

The split is cut into the training run's windows (its `seq_len`, its tokenizer, every line ending
with the end-of-line id), so the float result equals the run's own `results.json` figure.
"""

import json
import math
import os
import sys

import keras
import tensorflow as tf

from elita_tf.data import load_wikitext, make_tokenizer, token_windows
from elita_tf.data.pipeline import lm_dataset
from elita_tf.litert import litert_loss
from elita_tf.models import ElitaCausalLM

SPLITS = ("train", "validation", "test")
QUANTIZATIONS = ("int8",)


def evaluate(
    preset_dir,
    split="test",
    data_dir=None,
    tfds_dir=None,
    batch_size=None,
    eval_batches=None,
    quantize=None,
    litert=None,
    verbose=0,
):
    """Mean next-token cross-entropy of the preset's model on a split, as a dict.

    Args:
        preset_dir: a finished `elita-train` run directory (a keras-hub preset with its `run.json`).
        split: `"train"`, `"validation"` or `"test"`. Defaults to `"test"`.
        data_dir: a local WikiText directory; None reads `ELITA_WIKITEXT_DIR`, else downloads.
        tfds_dir: where tensorflow-datasets keeps prepared data (its default when None).
        batch_size: int. Defaults to the run's.
        eval_batches: int or None. A cap on batches.
        quantize: None, or `"int8"` to evaluate the model after `quantize("int8")`.
        litert: None, or the path of this run's LiteRT file (`elita-export
            --format litert`) to score the windows through `ai_edge_litert`'s
            interpreter instead, one token at a time.
        verbose: Keras `evaluate` verbosity (a progress bar over windows for `litert`).

    Returns:
        `{"split", "loss", "perplexity", "quantize", "litert", "windows", "seq_len", "data": {...},
        "trained_on": {...}}`.
        `data` is the split's source and SHA-256; `trained_on` the run's, to compare.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ValueError(f"`quantize` must be None or one of {QUANTIZATIONS}. Received: quantize={quantize!r}")
    if litert is not None and quantize is not None:
        raise ValueError(
            f"A LiteRT file carries its own quantization: pass `litert` or `quantize`. Received: quantize={quantize!r}"
        )
    manifest_path = os.path.join(preset_dir, "run.json")
    if not os.path.exists(manifest_path):
        raise FileNotFoundError(
            f"{manifest_path} is missing: `preset_dir` must be an elita-train run directory "
            f"(it records the windows to cut). Received: preset_dir={preset_dir!r}"
        )
    with open(manifest_path) as f:
        manifest = json.load(f)
    seq_len = manifest["training"]["seq_len"]
    batch_size = batch_size or manifest["training"]["batch_size"]

    causal_lm = ElitaCausalLM.from_preset(preset_dir)
    if quantize:
        causal_lm.backbone.quantize(quantize)
    splits, data = load_wikitext(manifest["data"]["dataset"], local_dir=data_dir, tfds_dir=tfds_dir, with_info=True)
    if data["sha256"] != manifest["data"]["sha256"]:
        print(
            f"Warning: the {data['dataset']} files read ({data['source']}, sha256 {data['sha256'][:12]}...) are not "
            f"the ones the run trained on (sha256 {manifest['data']['sha256'][:12]}...).",
            file=sys.stderr,
        )
    tokenizer = make_tokenizer(causal_lm.preprocessor.tokenizer.proto)
    windows = token_windows(splits[split], tokenizer, seq_len, vocabulary_size=causal_lm.backbone.vocabulary_size)

    def as_inputs(x, y):
        return {"token_ids": x, "padding_mask": tf.ones_like(x)}, y

    # Whole batches, as in training, capped by eval_batches.
    batches = len(windows) // batch_size
    scored = batch_size * (min(batches, eval_batches) if eval_batches else batches)
    if litert is not None:
        bar = keras.utils.Progbar(scored) if verbose else None
        loss = litert_loss(litert, windows[:scored], progress=(lambda: bar.add(1)) if bar else None)
    else:
        dataset = lm_dataset(windows, batch_size, shuffle=False).map(as_inputs)
        if eval_batches:
            dataset = dataset.take(eval_batches)
        model = keras.Model(causal_lm.backbone.input, causal_lm.backbone.output)
        model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        loss = float(model.evaluate(dataset, verbose=verbose))
    return {
        "split": split,
        "loss": loss,
        "perplexity": math.exp(loss),
        "quantize": quantize,
        "litert": litert,
        "windows": scored,
        "seq_len": seq_len,
        "data": data,
        "trained_on": manifest["data"],
    }

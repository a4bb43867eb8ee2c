"""`evaluate`: the loss and perplexity of a finished training run on a split of its data, or on any text.

    from elita_tf.training.evaluate import evaluate
    evaluate("runs/compare/elita/seed-0", split="test", quantize="int8")
    evaluate("runs/compare/elita/seed-0", split="test", litert="elita.tflite")  # the exported file
    evaluate("runs/compare/elita/seed-0", window_length=4096)                   # longer windows
    evaluate("runs/compare/elita/seed-0", window_length=4096, carry_state=True)  # the split as one stream
    evaluate("runs/mine", corpus=CorpusSettings("new-texts/*.txt"))              # all of other text

By default the split is cut into the training run's windows (its `sequence_length`, its
tokenizer, every line ending with the end-of-line id), so the float result equals the run's own
`results.json` figure. `window_length` cuts windows of another length; `carry_state` reads the
whole split as one sequence, `window_length` tokens at a time, each segment continuing from the
decoding state the previous one left (models whose every block carries a constant-size state).
Other text (`corpus`: text files or JSON Lines) is scored whole: windows that share one token
(`covering_windows`) score every token after the first exactly once, the last window padded.
Either way the result has the loss by position, in log-spaced buckets: does the model use
context it has seen?
"""

import dataclasses
import math
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from elita_tf.data import make_tokenizer, packed_windows, token_stream, token_windows
from elita_tf.data.corpus import corpus_of_record, load_corpus
from elita_tf.data.text_files import SPLITS, data_kind
from elita_tf.export import LiteRTModel
from elita_tf.export.litert import check_identity
from elita_tf.export.settings import check_quantize
from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.training.run_directory import MANIFEST_FILE, preset_of, read_manifest


def position_buckets(length, first=16, factor=4):
    """Log-spaced `(start, end)` buckets covering positions `[0, length)`: 0-16, 16-64, 64-256, ..."""
    edges, edge = [0], first
    while edges[-1] < length:
        edges.append(min(edge, length))
        edge *= factor
    return list(zip(edges[:-1], edges[1:]))


def _by_position(loss_sums, token_counts):
    """The `loss_by_position` list from per-position sums of losses and counts of tokens."""
    return [
        {
            "start": start,
            "end": end,
            "loss": float(loss_sums[start:end].sum() / token_counts[start:end].sum()),
            "tokens": int(token_counts[start:end].sum()),
        }
        for start, end in position_buckets(len(loss_sums))
    ]


def covering_windows(ids, document_starts, length):
    """Windows of `length + 1` tokens of a stream that score every token after the first exactly once.

    Window `i` holds tokens `[i T, i T + T + 1)`: consecutive windows share one token, the
    last target of one being the first input of the next, and the last window is padded.

    Args:
        ids, document_starts: int32 and bool `[N]` (`token_stream`).
        length: int `T`.

    Returns:
        `(windows int32 [W, T + 1], starts bool [W, T + 1], scored bool [W, T])`, `scored` False
        at the padding.
    """
    count = max(1, math.ceil((len(ids) - 1) / length))
    index = np.arange(count)[:, None] * length + np.arange(length + 1)[None, :]
    real = index < len(ids)
    index = np.minimum(index, len(ids) - 1)
    return np.where(real, ids[index], 0).astype(np.int32), document_starts[index] & real, real[:, 1:]


def _windowed_losses(backbone, windows, batch_size, progress, document_starts=None, scored=None):
    """Per-position sums of the next-token losses over `windows [N, T + 1]`, and token counts `[T]`.

    With `document_starts [N, T + 1]` (packed documents) no document sees
    another, and a document's first token is not scored. `scored [N, T]`, if
    given, leaves out the targets where it is False (padding).
    """

    packed = document_starts is not None

    @tf.function(reduce_retracing=True)
    def losses(rows, starts, scored):
        inputs, targets = rows[:, :-1], rows[:, 1:]
        # A window's first position starts what it holds, whatever came before it.
        window_starts = tf.concat([tf.ones_like(starts[:, :1]), starts[:, 1:-1]], axis=1)
        # The head's float32 loss a chunk at a time: no [B, T, V] logits in the compute dtype.
        hidden = backbone.hidden_states(inputs, document_starts=window_starts if packed else None, training=False)
        weights = tf.cast(tf.logical_and(tf.logical_not(starts[:, 1:]), scored), tf.float64)
        per_token = tf.cast(backbone.token_losses(hidden, targets), tf.float64) * weights
        return tf.reduce_sum(per_token, axis=0), tf.reduce_sum(weights, axis=0)

    if scored is None:
        scored = np.ones((len(windows), windows.shape[1] - 1), bool)
    if document_starts is None:
        document_starts = np.zeros(windows.shape, bool)
    length = windows.shape[1] - 1
    sums, counts = np.zeros(length), np.zeros(length)
    for start in range(0, len(windows), batch_size):
        rows = slice(start, start + batch_size)
        batch_sums, batch_counts = losses(
            tf.constant(windows[rows]), tf.constant(document_starts[rows]), tf.constant(scored[rows])
        )
        sums, counts = sums + batch_sums.numpy(), counts + batch_counts.numpy()
        progress(len(windows[rows]))
    return sums, counts


def _stream_losses(backbone, stream, segment_length, progress):
    """Per-position losses `[L - 1]` of one token stream `[L]`, read `segment_length` tokens at a time.

    Every segment continues from the decoding state the previous one left, so
    position `t` is scored with all `t` tokens before it in view.
    """

    @tf.function(reduce_retracing=True)
    def losses(inputs, targets, caches):
        hidden, caches = backbone.hidden_states(inputs, cache=caches)
        return backbone.token_losses(hidden, targets)[0], caches

    caches = backbone.get_initial_cache(1)
    scored = []
    for start in range(0, len(stream) - 1, segment_length):
        stop = min(start + segment_length, len(stream) - 1)
        per_token, caches = losses(
            tf.constant(stream[None, start:stop]), tf.constant(stream[None, start + 1 : stop + 1]), caches
        )
        scored.append(per_token.numpy().astype(np.float64))
        progress(1)
    return np.concatenate(scored)


def evaluate(
    run_dir,
    split="test",
    corpus=None,
    data_dir=None,
    tfds_dir=None,
    batch_size=None,
    eval_batches=None,
    quantize=None,
    litert=None,
    window_length=None,
    carry_state=False,
    position_mode=None,
    pack_documents=None,
    verbose=0,
):
    """Mean next-token cross-entropy of the preset's model on a split, with its loss by position, as a dict.

    Args:
        run_dir: a finished `elita-train` run directory.
        split: `"train"`, `"validation"` or `"test"`. Defaults to `"test"`.
        corpus: None (the run's own data, split as it was), or the
            `CorpusSettings` of other text. Text files and JSON Lines are
            scored whole, every token after the first exactly once (the
            result's split is `"all"`); WikiText and TFDS data by `split`.
        data_dir, tfds_dir: where the run's own data is read (a local WikiText
            directory, else `ELITA_WIKITEXT_DIR`, else a download; where
            tensorflow-datasets keeps prepared data).
        batch_size: int. Windows per batch. Defaults to the run's batch size,
            scaled to keep its tokens per batch with another `window_length`.
        eval_batches: int or None. A cap on batches (windowed evaluation) or on segments (`carry_state`).
        quantize: None, or `"int8"` to evaluate the model after `quantize("int8")`.
        litert: None, or the path of this run's LiteRT file (`elita-export
            --format litert`) to score the windows through `ai_edge_litert`'s
            interpreter instead, one token at a time.
        window_length: int or None. The window length `N`. Defaults to the
            run's `sequence_length`. Models with learned positions take at most
            their `max_sequence_length`; ELiTA's sinusoidal positions continue past it.
        carry_state: bool. Read the split as one stream, `N` tokens at a
            time, each segment continuing from the decoding state of the one
            before; needs a model whose every block carries a constant-size
            state (ELiTA, linear, additive without learned positions).
        position_mode: None (the run's), or `"fixed"` / `"clamped"`: read
            ELiTA's positions past its training length another way, with the
            same weights (the two modes agree up to the training length).
        pack_documents: None (as the run trained, in windows), or bool: windows
            of documents back to back that never see each other, each
            document's first token unscored (`elita-train --pack-documents`).
        verbose: 1 for a progress bar (on stdout, as Keras').

    Returns:
        `{"split", "loss", "perplexity", "tokens", "loss_by_position", "window_length", "carry_state",
        "pack_documents", "position_mode", "quantize", "litert", "windows", "sequence_length", "data": {...},
        "trained_on": {...}}`.
        `loss_by_position` is a list of `{"start", "end", "loss", "tokens"}`
        over log-spaced buckets of positions (within a window, or in the
        stream); `data` is the split's source and SHA-256; `trained_on` the run's, to compare.
    """
    if split not in SPLITS:
        raise ValueError(f"`split` must be one of {SPLITS}. Received: split={split!r}")
    check_quantize(quantize)
    if litert is not None and quantize is not None:
        raise ValueError(
            f"A LiteRT file carries its own quantization: pass `litert` or `quantize`. Received: quantize={quantize!r}"
        )
    if litert is not None and (window_length is not None or carry_state):
        raise ValueError(
            "A LiteRT file is scored in the run's own windows: leave `window_length` and `carry_state` unset. "
            f"Received: window_length={window_length!r}, carry_state={carry_state!r}"
        )
    if window_length is not None and (
        isinstance(window_length, bool) or not isinstance(window_length, int) or window_length < 2
    ):
        raise ValueError(f"`window_length` must be an integer >= 2. Received: window_length={window_length!r}")
    if pack_documents and (litert is not None or carry_state):
        raise ValueError(
            "Packed documents are scored in windows by the model itself: leave `litert` and `carry_state` unset. "
            f"Received: pack_documents=True, litert={litert!r}, carry_state={carry_state!r}"
        )
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise FileNotFoundError(
            f"{os.path.join(run_dir, MANIFEST_FILE)} is missing: `run_dir` must be an elita-train run directory "
            f"(it records the windows to cut). Received: run_dir={run_dir!r}"
        )
    sequence_length = manifest["training"]["sequence_length"]
    length = window_length or sequence_length
    if pack_documents is None:
        trained_packed = manifest["training"].get("pack_documents", False)
        pack_documents = trained_packed and litert is None and not carry_state
    batch_size = batch_size or max(1, manifest["training"]["batch_size"] * sequence_length // length)

    causal_lm = ElitaCausalLM.from_preset(preset_of(run_dir))
    if litert is not None:
        check_identity(litert, causal_lm)  # before any work: a file of another run would score as this one
    backbone = causal_lm.backbone
    if position_mode is not None and position_mode != backbone.position_mode:
        if litert is not None:
            raise ValueError(f"A LiteRT file has its own positions. Received: position_mode={position_mode!r}")
        trained = backbone
        backbone = ElitaBackbone.from_config({**trained.get_config(), "position_mode": position_mode})
        backbone.set_weights(trained.get_weights())
    if carry_state and backbone.decode_limit is not None:
        raise ValueError(
            f"`carry_state` needs a model whose every block carries a constant-size state; this one "
            f"({', '.join(sorted(set(backbone.blocks)))}, position_embedding={backbone.position_embedding}) holds "
            f"at most max_sequence_length={backbone.decode_limit} positions. Evaluate it in windows instead."
        )
    if backbone.position_embedding and length > backbone.max_sequence_length:
        raise ValueError(
            f"This model has learned positions for at most max_sequence_length={backbone.max_sequence_length} "
            f"tokens. Received: window_length={length}"
        )
    if quantize:
        backbone.quantize(quantize)
    # Other text is scored whole, each token after the first once (`covering_windows`).
    own_text = corpus is not None and data_kind(corpus.data) in ("text", "jsonl")
    whole = own_text and not carry_state
    if corpus is None:  # the run's own data, split as it was for training
        recorded = manifest["data"]
        own, seed = corpus_of_record(recorded["dataset"], recorded.get("corpus"), data_dir, tfds_dir)
        splits, data = load_corpus(own, seed=seed, document_starts=pack_documents)
        if data["sha256"] != manifest["data"]["sha256"]:
            print(
                f"Warning: the {data['dataset']} files read ({data['source']}, sha256 {data['sha256'][:12]}...) are "
                f"not the ones the run trained on (sha256 {manifest['data']['sha256'][:12]}...).",
                file=sys.stderr,
            )
    elif own_text:  # all of it, one split
        all_of_it = dataclasses.replace(corpus, holdout_fraction=0.0)
        splits, data = load_corpus(all_of_it, required_splits=("train",), document_starts=pack_documents or whole)
        split, splits = "all", {"all": splits["train"]}
    else:
        splits, data = load_corpus(corpus, document_starts=pack_documents)
    tokenizer = make_tokenizer(causal_lm.preprocessor.tokenizer.proto)
    starts = scored_targets = None
    if whole:  # every token after the first, each scored once
        ids, document_starts = token_stream(splits[split], tokenizer, vocabulary_size=backbone.vocabulary_size)
        windows, starts, scored_targets = covering_windows(ids, document_starts, length)
        starts = starts if pack_documents else None
    elif pack_documents:
        stream = token_stream(splits[split], tokenizer, vocabulary_size=backbone.vocabulary_size)
        windows, starts = packed_windows(*stream, length)
    else:
        # One stream: cut in the shortest windows, so that at most two tokens of the split are left out.
        cut = 2 if carry_state else length
        windows = token_windows(splits[split], tokenizer, cut, vocabulary_size=backbone.vocabulary_size)

    by_position = None
    if carry_state:
        # Consecutive windows are consecutive tokens: together they are the split as one stream.
        stream = windows.reshape(-1)
        if eval_batches:  # the first `eval_batches` segments
            stream = stream[: eval_batches * length + 1]
        bar = keras.utils.Progbar(math.ceil((len(stream) - 1) / length)) if verbose else None
        sums = _stream_losses(backbone, stream, length, bar.add if bar else lambda n: None)
        counts, scored = np.ones_like(sums), 1
    else:
        # Whole batches, as in training (text scored whole: every window), capped by eval_batches.
        batches = math.ceil(len(windows) / batch_size) if whole else len(windows) // batch_size
        scored = min(len(windows), batch_size * (min(batches, eval_batches) if eval_batches else batches))
        if scored == 0:
            raise ValueError(
                f"The {split} split makes {len(windows)} windows of {length + 1} tokens, no full batch of "
                f"{batch_size}: lower `batch_size`. Received: batch_size={batch_size}"
            )
        bar = keras.utils.Progbar(scored) if verbose else None
        if litert is None:
            sums, counts = _windowed_losses(
                backbone,
                windows[:scored],
                batch_size,
                bar.add if bar else lambda n: None,
                None if starts is None else starts[:scored],
                None if scored_targets is None else scored_targets[:scored],
            )
        else:  # the interpreter scores window by window and gives the mean
            loss, tokens = LiteRTModel(litert).loss(
                windows[:scored],
                progress=(lambda: bar.add(1)) if bar else None,
                scored=None if scored_targets is None else scored_targets[:scored],
            )
    if litert is None:
        loss, tokens = float(sums.sum() / counts.sum()), int(counts.sum())
        by_position = _by_position(sums, counts)
    return {
        "split": split,
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": tokens,
        "loss_by_position": by_position,
        "window_length": length,
        "carry_state": carry_state,
        "pack_documents": pack_documents,
        "position_mode": backbone.position_mode,
        "quantize": quantize,
        "litert": litert,
        "windows": scored,
        "sequence_length": sequence_length,
        "data": data,
        "trained_on": manifest["data"],
    }

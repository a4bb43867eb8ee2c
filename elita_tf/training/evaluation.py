"""`evaluate`: the loss and perplexity of a finished training run on a split of its data, or on any text.

    from elita_tf.training import EvaluateSettings, evaluate
    evaluate(EvaluateSettings("runs/compare/elita/seed-0", quantize="int8"))
    evaluate(EvaluateSettings("runs/compare/elita/seed-0", litert="elita.tflite"))  # the exported file
    evaluate(EvaluateSettings("runs/compare/elita/seed-0", sequence_length=4096))     # longer sequences
    evaluate(EvaluateSettings("runs/compare/elita/seed-0", sequence_length=4096, carry_state=True))  # one stream
    evaluate(EvaluateSettings("runs/mine", corpus=CorpusSettings("new-texts/*.txt")))  # all of other text

By default the split is cut into the training run's sequences (its `sequence_length`, its
tokenizer, every line ending with the end-of-line id), so the float result equals the run's own
`results.json` figure. What is cut is scored by one of three scorers: `score_sequences` (the model,
sequence by sequence), `score_stream` (the model, segment after segment of one stream, carrying its
decoding state) and `score_litert` (a LiteRT file in its interpreter). The first two run the
backbone's own loss (`token_losses`, as training does) as a Keras model, which `predict_on_batch`
compiles on every backend. Either way the result has the loss by position, in log-spaced buckets:
does the model use context it has seen?
"""

import dataclasses
import math
import os
import sys

import keras
import numpy as np
from keras import ops

from elita_tf.data.corpus import corpus_of_record, load_corpus
from elita_tf.data.token_files import FileSequences, cached_token_file
from elita_tf.data.text_files import data_kind
from elita_tf.export import LiteRTModel
from elita_tf.export.litert import check_identity
from elita_tf.models import ElitaBackbone, ElitaCausalLM
from elita_tf.renames import RenamedKeys
from elita_tf.training.evaluate_settings import EvaluateSettings
from elita_tf.training.run_directory import read_manifest
from elita_tf.training.run_files import MANIFEST_FILE, preset_of


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


def covering_sequences(ids, document_starts, length):
    """Sequences of `length + 1` tokens of a stream that score every token after the first exactly once.

    Sequence `i` holds tokens `[i T, i T + T + 1)`: consecutive sequences share one token, the
    last target of one being the first input of the next, and the last sequence is padded.

    Args:
        ids, document_starts: int32 and bool `[N]` (`TokenFile.read`).
        length: int `T`.

    Returns:
        `(sequences int32 [W, T + 1], starts bool [W, T + 1], scored bool [W, T])`, `scored` False
        at the padding.
    """
    count = max(1, math.ceil((len(ids) - 1) / length))
    index = np.arange(count)[:, None] * length + np.arange(length + 1)[None, :]
    real = index < len(ids)
    index = np.minimum(index, len(ids) - 1)
    return np.where(real, ids[index], 0).astype(np.int32), document_starts[index] & real, real[:, 1:]


class TokenLosses(keras.Model):
    """A backbone's next-token losses `[B, T]` as a Keras model of its own, whose variables are the backbone's:
    `predict_on_batch` compiles them on every backend (XLA on TensorFlow, `jit` on JAX).

    Inputs: `{"token_ids", "targets", "weights"}` `[B, T]` (a weight of 0 leaves a target out), and optional
    bool `"document_starts"` `[B, T]` (packed documents).
    """

    def __init__(self, backbone, **kwargs):
        super().__init__(autocast=False, **kwargs)  # a carried state keeps its dtypes under a mixed policy
        self.backbone = backbone
        self.built = True  # nothing of its own to build

    def call(self, inputs):
        hidden = self.backbone.hidden_states(inputs["token_ids"], document_starts=inputs.get("document_starts"))
        return self.backbone.token_losses(hidden, inputs["targets"]) * ops.cast(inputs["weights"], "float32")


class CarriedTokenLosses(TokenLosses):
    """`TokenLosses` of a segment that continues a decoding state: inputs `{"token_ids", "targets", "cache"}`,
    outputs `(losses [B, T], the state after the segment)`."""

    def call(self, inputs):
        hidden, cache = self.backbone.hidden_states(inputs["token_ids"], cache=inputs["cache"])
        return self.backbone.token_losses(hidden, inputs["targets"]), cache


def score_sequences(backbone, sequences, batch_size, progress, document_starts=None, scored=None):
    """Per-position sums of the next-token losses over `sequences [N, T + 1]`, and token counts `[T]`.

    With `document_starts [N, T + 1]` (packed documents) no document sees
    another, and a document's first token is not scored. `scored [N, T]`, if
    given, leaves out the targets where it is False (padding).
    """
    model = TokenLosses(backbone)
    weights = np.ones((len(sequences), sequences.shape[1] - 1), bool) if scored is None else scored.copy()
    if document_starts is not None:
        weights &= ~document_starts[:, 1:]
    length = sequences.shape[1] - 1
    sums, counts = np.zeros(length), np.zeros(length)
    for start in range(0, len(sequences), batch_size):
        rows = slice(start, start + batch_size)
        inputs = {"token_ids": sequences[rows, :-1], "targets": sequences[rows, 1:], "weights": weights[rows]}
        if document_starts is not None:
            # A sequence's first position starts what it holds, whatever came before it.
            starts = document_starts[rows, :-1].copy()
            starts[:, 0] = True
            inputs["document_starts"] = starts
        sums += model.predict_on_batch(inputs).astype(np.float64).sum(axis=0)
        counts += weights[rows].sum(axis=0)
        progress(len(inputs["token_ids"]))
    return sums, counts


def score_stream(backbone, stream, segment_length, progress):
    """Per-position losses `[L - 1]` of one token stream `[L]`, read `segment_length` tokens at a time.

    Every segment continues from the decoding state the previous one left, so
    position `t` is scored with all `t` tokens before it in view.
    """
    model = CarriedTokenLosses(backbone)
    cache = keras.tree.map_structure(ops.convert_to_numpy, backbone.get_initial_cache(1))
    scored = []
    for start in range(0, len(stream) - 1, segment_length):
        stop = min(start + segment_length, len(stream) - 1)
        inputs = {"token_ids": stream[None, start:stop], "targets": stream[None, start + 1 : stop + 1], "cache": cache}
        losses, cache = model.predict_on_batch(inputs)
        scored.append(losses[0].astype(np.float64))
        progress(1)
    return np.concatenate(scored)


def score_litert(path, sequences, progress, scored=None):
    """`(mean loss, tokens)` of sequences `[N, T + 1]` through the LiteRT file `path`, one token at a time."""
    return LiteRTModel(path).loss(sequences, progress=progress, scored=scored)


def evaluate(settings):
    """Mean next-token cross-entropy of a run's model on a split, with its loss by position, as a dict.

    Args:
        settings: `EvaluateSettings`: the run, the split or other text, and how to cut and score it.

    Returns:
        `{"split", "loss", "perplexity", "tokens", "loss_by_position", "sequence_length", "carry_state",
        "pack_documents", "position_mode", "quantize", "litert", "sequences", "trained_sequence_length",
        "data": {...},
        "trained_on": {...}}`.
        `loss_by_position` is a list of `{"start", "end", "loss", "tokens"}`
        over log-spaced buckets of positions (within a sequence, or in the
        stream; None through LiteRT); `data` is the split's source and
        SHA-256; `trained_on` the run's, to compare. The keys' 0.1.0 names
        (`window_length`, `windows`) read today's, with a warning.

    Example:
    >>> evaluate(EvaluateSettings("runs/elita", split="validation"))["perplexity"]  # doctest: +SKIP
    """
    if not isinstance(settings, EvaluateSettings):
        raise ValueError(f"`settings` must be an EvaluateSettings. Received: settings={settings!r}")
    manifest = read_manifest(settings.run_dir)
    if manifest is None:
        raise FileNotFoundError(
            f"{os.path.join(settings.run_dir, MANIFEST_FILE)} is missing: `run_dir` must be an elita-train run "
            f"directory (it records the sequences to cut). Received: run_dir={settings.run_dir!r}"
        )
    trained_length = manifest["training"]["sequence_length"]
    length = settings.sequence_length or trained_length
    pack_documents = settings.pack_documents
    if pack_documents is None:
        trained_packed = manifest["training"].get("pack_documents", False)
        pack_documents = trained_packed and settings.litert is None and not settings.carry_state
    batch_size = settings.batch_size or max(1, manifest["training"]["batch_size"] * trained_length // length)
    causal_lm = ElitaCausalLM.from_preset(preset_of(settings.run_dir))
    backbone = _backbone_to_score(causal_lm, settings, length)
    cut = _cut(settings, manifest, causal_lm, length, pack_documents)
    sequences, starts, scored_targets = cut.sequences, cut.document_starts, cut.scored
    whole = scored_targets is not None  # other text, every sequence scored

    by_position = None
    if settings.carry_state:
        stream = cut.stream
        if settings.eval_batches:  # the first `eval_batches` segments
            stream = stream[: settings.eval_batches * length + 1]
        progress = _progress(math.ceil((len(stream) - 1) / length), settings.verbose)
        sums = score_stream(backbone, stream, length, progress)
        counts, scored = np.ones_like(sums), 1
    else:
        # Whole batches, as in training (text scored whole: every sequence), capped by eval_batches.
        batches = math.ceil(len(sequences) / batch_size) if whole else len(sequences) // batch_size
        capped = min(batches, settings.eval_batches) if settings.eval_batches else batches
        scored = min(len(sequences), batch_size * capped)
        if scored == 0:
            raise ValueError(
                f"The {cut.split} split makes {len(sequences)} sequences of {length + 1} tokens, no full batch of "
                f"{batch_size}: lower `batch_size`. Received: batch_size={batch_size}"
            )
        progress = _progress(scored, settings.verbose)
        starts = None if starts is None else starts[:scored]
        scored_targets = None if scored_targets is None else scored_targets[:scored]
        if settings.litert is None:
            sums, counts = score_sequences(backbone, sequences[:scored], batch_size, progress, starts, scored_targets)
        else:
            loss, tokens = score_litert(settings.litert, sequences[:scored], lambda: progress(1), scored_targets)
    if settings.litert is None:
        loss, tokens = float(sums.sum() / counts.sum()), int(counts.sum())
        by_position = _by_position(sums, counts)
    result = {
        "split": cut.split,
        "loss": loss,
        "perplexity": math.exp(loss),
        "tokens": tokens,
        "loss_by_position": by_position,
        "sequence_length": length,
        "carry_state": settings.carry_state,
        "pack_documents": pack_documents,
        "position_mode": backbone.position_mode,
        "quantize": settings.quantize,
        "litert": settings.litert,
        "sequences": scored,
        "trained_sequence_length": trained_length,
        "data": cut.data,
        "trained_on": manifest["data"],
    }
    return RenamedKeys("evaluate", result)


def _progress(total, verbose):
    """`progress(n)`: a Keras progress bar's `add` (verbose), or nothing."""
    return keras.utils.Progbar(total).add if verbose else lambda n: None


def _backbone_to_score(causal_lm, settings, length):
    """The run's backbone as `settings` asks to score it (its positions read another way, quantized), checked
    against what it can score."""
    if settings.litert is not None:
        check_identity(settings.litert, causal_lm)  # before any work: a file of another run would score as this one
    backbone = causal_lm.backbone
    position_mode = settings.position_mode
    if position_mode is not None and position_mode != backbone.position_mode:
        if settings.litert is not None:
            raise ValueError(f"A LiteRT file has its own positions. Received: position_mode={position_mode!r}")
        trained = backbone
        backbone = ElitaBackbone.from_config({**trained.get_config(), "position_mode": position_mode})
        backbone.set_weights(trained.get_weights())
    if settings.carry_state:
        backbone.check_carries_state()
    if backbone.position_embedding and length > backbone.max_sequence_length:
        raise ValueError(
            f"This model has learned positions for at most max_sequence_length={backbone.max_sequence_length} "
            f"tokens. Received: sequence_length={length}"
        )
    if settings.quantize:
        backbone.quantize(settings.quantize)
    return backbone


@dataclasses.dataclass(frozen=True)
class _Cut:
    """What evaluation scores of a split: `stream [L]` (a carried state's), or `sequences [N, length + 1]` with
    their `document_starts` (packed documents) and `scored` targets `[N, length]` (other text, each token once),
    either None where unused; `data`, the source and SHA-256 of what was read."""

    split: str
    data: dict
    stream: np.ndarray = None
    sequences: np.ndarray = None
    document_starts: np.ndarray = None
    scored: np.ndarray = None


def _cut(settings, manifest, causal_lm, length, pack_documents):
    """The `_Cut` of what `settings` scores, from the split's token files, the ones training reads
    (`cached_token_file`): the run's sequences as it cut them (`FileSequences`), with `carry_state` the split
    as one stream, and other text whole (`covering_sequences`), every token after the first scored once."""
    corpus, split = settings.corpus, settings.split
    own_text = corpus is not None and data_kind(corpus.data) in ("text", "jsonl")
    if corpus is None:  # the run's own data, split as it was for training
        recorded = manifest["data"]
        own, seed = corpus_of_record(recorded["dataset"], recorded.get("corpus"), settings.data_dir, settings.tfds_dir)
        splits, data = load_corpus(own, seed=seed, document_starts=True)
        if data["sha256"] != recorded["sha256"]:
            print(
                f"Warning: the {data['dataset']} files read ({data['source']}, sha256 {data['sha256'][:12]}...) are "
                f"not the ones the run trained on (sha256 {recorded['sha256'][:12]}...).",
                file=sys.stderr,
            )
    elif own_text:  # all of it, one split
        all_of_it = dataclasses.replace(corpus, holdout_fraction=0.0)
        splits, data = load_corpus(all_of_it, required_splits=("train",), document_starts=True)
        split, splits = "all", {"all": splits["train"]}
    else:
        splits, data = load_corpus(corpus, document_starts=True)
    tokenizer, vocabulary_size = causal_lm.preprocessor.tokenizer, causal_lm.backbone.vocabulary_size
    tokens = cached_token_file(splits[split], tokenizer, data["sha256"], split, vocabulary_size)
    if settings.carry_state:
        return _Cut(split, data, stream=tokens.stream()[0])
    if own_text:
        sequences, starts, scored = covering_sequences(*tokens.stream(), length)
    else:
        examples = FileSequences(tokens, length + 1)
        if not len(examples):
            raise ValueError(f"The {split} split is shorter than one sequence of {length + 1} tokens.")
        (sequences, starts), scored = examples.rows(range(len(examples))), None
    return _Cut(split, data, sequences=sequences, document_starts=starts if pack_documents else None, scored=scored)

"""SavedModel export for serving: token ids -> logits, and text -> generated text.

    elita-export --run-dir runs/compare/elita/seed-0 --output exported/elita

Signatures (dynamic batch and length):
- `serving_default(token_ids int32 [B, T]) -> {"logits": float32 [B, T, V]}`
- `generate(prompts string [B], max_new_tokens int32 []) -> {"text": string [B], "token_ids": int32 [B, N]}`:
  SentencePiece tokenisation with the start token before each prompt (as `ElitaCausalLM.generate`),
  `ElitaCausalLM.generate_step` with keras-hub's greedy sampler, and
  detokenisation, all in the graph.

Loading the SavedModel needs the tensorflow-text ops registered (`load_saved_model`, or `import tensorflow_text` first);
TensorFlow's `saved_model_cli show` needs nothing, and `saved_model_cli run` runs with them:

    python -c "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; \
        sys.exit(saved_model_cli.main())" run --dir exported/elita --tag_set serve \
        --signature_def generate --inputs "prompts=prompts.npy;max_new_tokens=n.npy"
"""

import keras
import keras_hub
import tensorflow as tf

from elita_tf.export.settings import DEFAULT_MAX_NEW_TOKENS, check_max_new_tokens
from elita_tf.models import ElitaCausalLM


def _prepend(ragged, token_id, rows):
    """`token_id` before each row of `ragged` where the bool `rows` `[B]` is True."""
    count = tf.cast(rows, tf.int64)
    seed = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(count)], token_id), count)
    return tf.concat([tf.cast(seed, ragged.dtype), ragged], axis=1)


def _check_length(longest, max_new_tokens, limit, cap):
    """Graph assertions: `0 <= max_new_tokens <= cap`, and the longest prompt plus them within `limit` (None: none)."""
    checks = [
        tf.debugging.Assert(
            max_new_tokens >= 0, ["max_new_tokens must be >= 0. Received: max_new_tokens =", max_new_tokens]
        ),
        tf.debugging.Assert(
            max_new_tokens <= cap,
            [
                f"max_new_tokens must be at most {cap}, the cap this SavedModel was exported with "
                "(elita-export --max-new-tokens). Received: max_new_tokens =",
                max_new_tokens,
            ],
        ),
    ]
    if limit is not None:
        message = (
            f"The prompt and max_new_tokens exceed the {limit} positions this model's position table or "
            "decoding buffers hold. Received: prompt length ="
        )
        checks.append(
            tf.debugging.Assert(
                longest + max_new_tokens <= limit, [message, longest, "max_new_tokens =", max_new_tokens]
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(max_new_tokens)


def export_saved_model(causal_lm, path, max_new_tokens=DEFAULT_MAX_NEW_TOKENS):
    """Writes `causal_lm` (an `ElitaCausalLM` with its preprocessor) as a SavedModel; returns `path`.

    `generate` reads each prompt as `ElitaCausalLM.generate` does, after the
    start token (the end-of-line id: every training line ends with it), so
    both give the same greedy tokens; it returns empty texts for `max_new_tokens=0`,
    and fails with the values named for zero prompts, a negative `max_new_tokens`, one
    above the export's cap, or one that takes the prompt past
    `max_sequence_length` in a model with finite buffers. `serving_default`
    fails on token ids outside `[0, vocabulary_size)`, naming them. Load it
    with `load_saved_model`, which registers the tokenizer's ops first.

    Args:
        causal_lm: an `ElitaCausalLM` with its preprocessor.
        path: the directory to write.
        max_new_tokens: int. The most tokens one `generate` request may ask
            for: a serving signature's memory and time grow with it, so a
            request past it fails instead. Defaults to `1024`.
    """
    check_max_new_tokens(max_new_tokens)
    if causal_lm.preprocessor is None:
        raise ValueError(
            "The SavedModel's `generate` signature tokenizes text: export an ElitaCausalLM with its preprocessor "
            "(ElitaCausalLM.from_preset gives one). Received: preprocessor=None"
        )
    preprocessor = causal_lm.preprocessor
    tokenizer = preprocessor.tokenizer  # the preset's own, in the graph
    start = tokenizer.start_token_id  # the end-of-line piece: a prompt starts a new line of text
    backbone = causal_lm.backbone
    greedy = ElitaCausalLM(backbone)  # the same weights, with keras-hub's greedy sampler
    greedy.sampler = keras_hub.samplers.GreedySampler()

    def serve(token_ids):
        logits = backbone({"token_ids": token_ids, "padding_mask": tf.ones_like(token_ids)})
        return {"logits": tf.cast(logits, tf.float32)}  # float32 whatever the compute dtype: the documented signature

    cap = max_new_tokens

    def generate(prompts, max_new_tokens):
        # First of all: with no prompt, the longest prompt below is the int32 minimum and the error obscure.
        # The count is 0 whenever this fails.
        empty = tf.debugging.Assert(tf.size(prompts) > 0, ["generate needs at least one prompt. Received: 0 prompts"])
        with tf.control_dependencies([empty]):
            prompts = tf.identity(prompts)
        ragged = tokenizer.tokenize(prompts)
        # As keras-hub's `generate_preprocess`: the start token before every prompt (`add_start_token`); an
        # empty prompt has nothing else to continue from.
        rows = tf.fill([tf.size(prompts)], True) if preprocessor.add_start_token else tf.equal(ragged.row_lengths(), 0)
        ragged = _prepend(ragged, start, rows)
        lengths = tf.cast(ragged.row_lengths(), tf.int32)
        longest = tf.reduce_max(lengths)
        max_new_tokens = _check_length(longest, max_new_tokens, backbone.decode_limit, cap)
        # Right-padded prompts with room for the new tokens.
        token_ids = tf.pad(tf.cast(ragged.to_tensor(default_value=0), tf.int32), [[0, 0], [0, max_new_tokens]])
        padding_mask = tf.range(longest + max_new_tokens)[None, :] < lengths[:, None]
        filled = greedy.generate_step({"token_ids": token_ids, "padding_mask": padding_mask})["token_ids"]
        # Row b's new tokens start right after its prompt.
        tokens = tf.gather(filled, lengths[:, None] + tf.range(max_new_tokens)[None, :], batch_dims=1)
        return {"text": tokenizer.detokenize(tokens), "token_ids": tokens}

    archive = keras.export.ExportArchive()
    archive.track(backbone)
    # keras-hub's tokenizer is a layer that is never built: tracked through a module holding it, its
    # SentencePiece model goes into the SavedModel.
    holder = tf.Module()
    holder.tokenizer = tokenizer
    archive.track(holder)
    archive.add_endpoint("serving_default", serve, [tf.TensorSpec([None, None], tf.int32, name="token_ids")])
    archive.add_endpoint(
        "generate",
        generate,
        [tf.TensorSpec([None], tf.string, name="prompts"), tf.TensorSpec([], tf.int32, name="max_new_tokens")],
    )
    archive.write_out(path, verbose=False)
    return path


def load_saved_model(path):
    """`tf.saved_model.load(path)` of a SavedModel `export_saved_model` wrote, its tokenizer's ops registered first.

    Loading it with `tf.saved_model.load` alone fails with "Op type not
    registered 'SentencepieceOp'" unless `tensorflow_text` was imported.
    """
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops the `generate` signature holds)

    return tf.saved_model.load(path)

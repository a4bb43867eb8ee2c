"""SavedModel export for serving: token ids -> logits, and text -> generated text.

    elita-export --run-dir runs/compare/elita/seed-0 --output exported/elita     (elita_tf.cli.export)

Signatures (dynamic batch and length):
- `serving_default(token_ids int32 [B, T]) -> {"logits": float32 [B, T, V]}`
- `generate(prompts string [B], max_new_tokens int32 []) -> {"text": string [B], "token_ids": int32 [B, N]}`:
  SentencePiece tokenisation, greedy cached generation and detokenisation, all in the graph.

Loading the SavedModel needs the tensorflow-text ops registered (`import tensorflow_text` first);
TensorFlow's `saved_model_cli show` needs nothing, and `saved_model_cli run` runs with them:

    python -c "import sys, tensorflow_text; from tensorflow.python.tools import saved_model_cli; \
        sys.exit(saved_model_cli.main())" run --dir exported/elita --tag_set serve \
        --signature_def generate --inputs "prompts=prompts.npy;max_new_tokens=n.npy"
"""

import keras
import sentencepiece
import tensorflow as tf

from elita_tf.data.tokenizer import make_tokenizer
from elita_tf.generation import Generator
from elita_tf.models.config import DecoderConfig


def _right_padded(ragged):
    """A ragged `[B, (P)]` batch as left-aligned ids `[B, P]`, padded on the right, and its mask."""
    ids = ragged.to_tensor(default_value=0)
    mask = tf.range(tf.shape(ids)[1])[None, :] < tf.cast(ragged.row_lengths(), tf.int32)[:, None]
    return tf.cast(ids, tf.int32), mask


def _seed_empty(ragged, token_id):
    """Rows with no token get `token_id`: an empty prompt starts a new line of text."""
    empty = tf.cast(tf.equal(ragged.row_lengths(), 0), tf.int64)
    seed = tf.RaggedTensor.from_row_lengths(tf.fill([tf.reduce_sum(empty)], token_id), empty)
    return tf.concat([tf.cast(seed, ragged.dtype), ragged], axis=1)


def export_saved_model(model, config, tokenizer_proto, path):
    """Writes the SavedModel (through `keras.export.ExportArchive`); returns `path`.

    `generate` continues an empty prompt from the end-of-line id (every
    training line ends with it), returns empty texts for `max_new_tokens=0`,
    and fails with the values named for a negative `max_new_tokens` or one
    that takes the prompt past `context_length`. `serving_default` fails on
    token ids outside `[0, vocab_size)`, naming them.
    """
    if isinstance(config, dict):
        config = DecoderConfig.from_config(config)
    tokenizer = make_tokenizer(tokenizer_proto, add_eos=False)
    end_of_line = sentencepiece.SentencePieceProcessor(model_proto=tokenizer_proto).eos_id()
    generator = Generator(model, config)

    def serve(token_ids):
        return {"logits": model(token_ids, training=False)}

    def generate(prompts, max_new_tokens):
        ids, mask = _right_padded(_seed_empty(tokenizer.tokenize(prompts), end_of_line))
        tokens = generator._generate(ids, mask, max_new_tokens, tf.constant([0, 0]))
        return {"text": tokenizer.detokenize(tokens), "token_ids": tokens}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(tokenizer)
    archive.add_endpoint("serving_default", serve, [tf.TensorSpec([None, None], tf.int32, name="token_ids")])
    archive.add_endpoint(
        "generate",
        generate,
        [tf.TensorSpec([None], tf.string, name="prompts"), tf.TensorSpec([], tf.int32, name="max_new_tokens")],
    )
    archive.write_out(path, verbose=False)
    return path

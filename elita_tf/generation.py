"""Token-by-token generation from each layer's decoding cache.

Prompts of different lengths share a batch right-padded, as in keras-hub.
The positions before the shortest prompt's last token are prefilled in one
parallel pass; from there every position costs one step of each layer from
its cache (constant-size state for `Attention2`, linear attention and global
additive attention, ring buffers for windowed layers, a key/value buffer for
softmax layers). A row still inside its prompt is fed its own next token, so
each row's continuation is exactly what it would be alone, for every layer
type. The loop is one `tf.function` with a `tf.while_loop`, traced once per
sampler: other prompt lengths, batch sizes or `max_new_tokens` do not retrace.
"""

import tensorflow as tf

from elita_tf.layers.checks import check_token_ids
from elita_tf.models.config import DecoderConfig
from elita_tf.models.decoder import decoder_forward
from elita_tf.ops.utils import document_positions, position_after, real_extent

SAMPLERS = ("greedy", "top_k", "top_p")


def check_generation_length(prompt_length, max_new_tokens, limit):
    """`max_new_tokens >= 0` and prompt + new tokens within `limit` (None: no limit).

    Eagerly a `ValueError`, in a graph an assertion. Returns `max_new_tokens`,
    in a graph dependent on the assertions, so they run before it is used.
    """
    if isinstance(prompt_length, int) and isinstance(max_new_tokens, int):
        if max_new_tokens < 0:
            raise ValueError(f"`max_new_tokens` must be >= 0. Received: max_new_tokens={max_new_tokens}")
        if limit is not None and prompt_length + max_new_tokens > limit:
            raise ValueError(
                f"The prompt ({prompt_length} tokens) and max_new_tokens={max_new_tokens} exceed the "
                f"{limit} positions this model's position table or decoding buffers hold: shorten one of them."
            )
        return max_new_tokens
    checks = [
        tf.debugging.Assert(
            max_new_tokens >= 0, ["max_new_tokens must be >= 0. Received: max_new_tokens =", max_new_tokens]
        )
    ]
    if limit is not None:
        checks.append(
            tf.debugging.Assert(
                prompt_length + max_new_tokens <= limit,
                [
                    f"The prompt and max_new_tokens exceed the {limit} positions this model's position table or "
                    "decoding buffers hold. Received: prompt length =",
                    prompt_length,
                    "max_new_tokens =",
                    max_new_tokens,
                ],
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(max_new_tokens)


def empty_caches(config, layers, batch_size):
    """The decoding cache before any position: each block's (`block_{i}`) and each row's `position` `[B]`."""
    caches = {f"block_{i}": layers[f"block_{i}"].get_initial_cache(batch_size) for i in range(config.num_layers)}
    caches["position"] = tf.zeros([batch_size], tf.int32)
    return caches


def forward_with_cache(config, layers, tokens, caches, padding_mask=None, head=True, resets=None, training=None):
    """Continues the sequence `caches` summarises with `tokens [B, T]`; returns `(logits [B, T, V], new_caches)`.

    Row `b` continues at `caches["position"][b]`. With `padding_mask`,
    positions after a row's last real one (right padding) are not part of
    its sequence: its cache ends after its last real position, and what
    follows overwrites the padding. `head=False` returns the final hidden
    states `[B, T, d]` in place of the logits. With `resets [B, T]` (True
    where a new document starts) no position sees an earlier document, and
    positions restart at 0 there (`decoder_forward`).
    """
    blocks = [caches[f"block_{i}"] for i in range(config.num_layers)]
    position = caches["position"]
    outputs, blocks = decoder_forward(
        config, layers, tokens, padding_mask, blocks, start_index=position, training=training, head=head, resets=resets
    )
    new_caches = {f"block_{i}": cache for i, cache in enumerate(blocks)}
    length = tf.shape(tokens)[1]
    end = real_extent(padding_mask, length)
    if resets is None:
        new_caches["position"] = position + end
    else:
        new_caches["position"] = position_after(document_positions(length, position, resets), position, end)
    return outputs, new_caches


def right_pad(prompts, pad_id=0):
    """`(ids [B, P], mask [B, P])` from a list of token-id lists, left-aligned and padded on the right."""
    if not len(prompts):
        raise ValueError("There are no prompts to continue. Received: prompts=[]")
    for index, prompt in enumerate(prompts):
        if not len(prompt):
            raise ValueError(
                f"Prompt {index} is empty: generation continues at least one token (for a new line of "
                f"text, the end-of-line id the training data put after every line). Received: prompts[{index}]=[]"
            )
    length = max(len(p) for p in prompts)
    ids = [list(p) + [pad_id] * (length - len(p)) for p in prompts]
    mask = [[True] * len(p) + [False] * (length - len(p)) for p in prompts]
    return tf.constant(ids, tf.int32), tf.constant(mask, tf.bool)


def _select(logits, sampler, temperature, top_k, top_p, seed):
    """The next token `[B]` from float32 logits `[B, V]`."""
    if sampler == "greedy":
        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    logits = logits / temperature
    if sampler == "top_k":
        values, _ = tf.math.top_k(logits, k=top_k)
        logits = tf.where(logits < values[:, -1:], tf.float32.min, logits)
    else:
        order = tf.argsort(logits, axis=-1, direction="DESCENDING")
        sorted_logits = tf.gather(logits, order, batch_dims=1)
        probs = tf.nn.softmax(sorted_logits, axis=-1)
        # Keep the smallest prefix whose mass reaches top_p (always the first token).
        keep_sorted = tf.cumsum(probs, axis=-1, exclusive=True) < top_p
        keep = tf.scatter_nd(
            tf.stack([tf.repeat(tf.range(tf.shape(order)[0]), tf.shape(order)[1]), tf.reshape(order, [-1])], 1),
            tf.reshape(keep_sorted, [-1]),
            tf.shape(order),
        )
        logits = tf.where(keep, logits, tf.float32.min)
    return tf.cast(tf.random.stateless_categorical(logits, 1, seed=seed)[:, 0], tf.int32)


class Generator:
    """Compiled generation for one model; call it like `generate`.

    Args:
        model: a model from `build_decoder` (or loaded from `.keras`).
        config: its `DecoderConfig` (or the dict).
        sampler: `"greedy"`, `"top_k"` or `"top_p"`.
        temperature, top_k, top_p: sampling settings.
        jit_compile: bool. Compile the prefill and the decoding loop with XLA
            (Keras' default on GPUs); every shape in the loop is static.
    """

    def __init__(self, model, config, sampler="greedy", temperature=1.0, top_k=40, top_p=0.9, jit_compile=False):
        if sampler not in SAMPLERS:
            raise ValueError(f"`sampler` must be one of {SAMPLERS}. Received: sampler={sampler!r}")
        if not temperature > 0:
            raise ValueError(f"`temperature` must be positive. Received: temperature={temperature!r}")
        self.config = DecoderConfig.from_config(config) if isinstance(config, dict) else config
        self.layers = {layer.name: layer for layer in model.layers}
        self.sampler, self.temperature, self.top_k, self.top_p = sampler, float(temperature), int(top_k), float(top_p)
        self.run = tf.function(
            self._generate,
            jit_compile=jit_compile,
            input_signature=[
                tf.TensorSpec([None, None], tf.int32),
                tf.TensorSpec([None, None], tf.bool),
                tf.TensorSpec([], tf.int32),
                tf.TensorSpec([2], tf.int32),
            ],
        )

    def _generate(self, ids, mask, max_new_tokens, seed):
        config, layers = self.config, self.layers
        batch, width = tf.shape(ids)[0], tf.shape(ids)[1]
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        longest = tf.reduce_max(lengths)
        max_new_tokens = check_generation_length(longest, max_new_tokens, config.decode_limit)
        # Prefill every position before the shortest prompt's last token: the same in every row.
        first = tf.reduce_min(lengths) - 1
        _, caches = forward_with_cache(
            config,
            layers,
            ids,
            empty_caches(config, layers, batch),
            tf.tile(tf.range(width)[None, :] < first, [batch, 1]),
        )
        # Each row's prompt then its new tokens; a row inside its prompt is fed its own token.
        sequence = tf.concat([tf.where(mask, ids, 0), tf.zeros([batch, max_new_tokens], tf.int32)], axis=1)
        prompt_mask = tf.concat([mask, tf.zeros([batch, max_new_tokens], tf.bool)], axis=1)

        def step(index, sequence, caches):
            token = tf.gather(sequence, index, axis=1)
            logits, caches = forward_with_cache(config, layers, token[:, None], caches)
            chosen = _select(logits[:, 0], self.sampler, self.temperature, self.top_k, self.top_p, seed + index)
            keep = tf.gather(prompt_mask, index + 1, axis=1)
            next_token = tf.where(keep, tf.gather(sequence, index + 1, axis=1), chosen)
            sequence = tf.tensor_scatter_nd_update(
                sequence, tf.stack([tf.range(batch), tf.fill([batch], index + 1)], axis=1), next_token
            )
            return index + 1, sequence, caches

        _, sequence, _ = tf.while_loop(
            lambda index, *_: index < longest - 1 + max_new_tokens, step, (first, sequence, caches)
        )
        # Row b's new tokens start right after its prompt.
        columns = lengths[:, None] + tf.range(max_new_tokens)[None, :]
        return tf.gather(sequence, columns, batch_dims=1)  # [B, max_new_tokens]

    def __call__(self, prompts, max_new_tokens, seed=0, mask=None):
        """Generates `max_new_tokens` after each prompt.

        Args:
            prompts: a list of token-id lists (any lengths), or int `[B, P]`
                right-padded ids with `mask`.
            max_new_tokens: int.
            seed: int, for the samplers.
            mask: bool `[B, P]` for padded `prompts`, False at padding.

        Returns:
            int32 `[B, max_new_tokens]`.
        """
        if mask is None:
            ids, mask = right_pad(prompts) if isinstance(prompts, (list, tuple)) else (prompts, None)
            if mask is None:
                mask = tf.ones(tf.shape(ids), tf.bool)
        else:
            ids = prompts
        ids, _ = check_token_ids(ids, self.config.vocab_size, name="prompts")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"`max_new_tokens` must be an integer. Received: max_new_tokens={max_new_tokens!r}")
        check_generation_length(ids.shape[1], max_new_tokens, self.config.decode_limit)
        return self.run(
            tf.cast(ids, tf.int32), tf.cast(mask, tf.bool), tf.constant(max_new_tokens), tf.constant([seed, 0])
        )


def generate(model, config, prompts, max_new_tokens, sampler="greedy", temperature=1.0, top_k=40, top_p=0.9, seed=0):
    """Generates `max_new_tokens` tokens after each prompt (see `Generator`).

    Example:
    >>> tokens = generate(model, config, [[5, 8, 2], [7]], max_new_tokens=20)  # doctest: +SKIP
    """
    return Generator(model, config, sampler, temperature, top_k, top_p)(prompts, max_new_tokens, seed)

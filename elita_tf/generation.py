"""Token-by-token generation from each layer's decoding cache.

The prompt is prefilled in one parallel pass; then every new token costs one
step of each layer from its cache: constant-size state for `Attention2`,
linear attention and global additive attention, ring buffers for windowed
layers, a key/value cache for softmax layers. The loop is one `tf.function`
with a `tf.while_loop`, traced once per sampler: other prompt lengths,
batch sizes or `max_new_tokens` do not retrace.

Prompts of different lengths share a batch left-padded: padded positions are
masked out of every layer and positions count from each prompt's first real
token, so a prompt's continuation does not depend on its batch-mates.
"""

import tensorflow as tf

from elita_tf.layers.checks import check_token_ids
from elita_tf.models.config import DecoderConfig
from elita_tf.models.decoder import decoder_forward

SAMPLERS = ("greedy", "top_k", "top_p")


def check_generation_length(prompt_length, max_new_tokens, limit):
    """`max_new_tokens >= 0` and prompt + new tokens within `limit`: eagerly a `ValueError`, in a graph an assertion.

    Returns `max_new_tokens`, in a graph dependent on the assertions, so they run before it is used.
    """
    if isinstance(prompt_length, int) and isinstance(max_new_tokens, int):
        if max_new_tokens < 0:
            raise ValueError(f"`max_new_tokens` must be >= 0. Received: max_new_tokens={max_new_tokens}")
        if prompt_length + max_new_tokens > limit:
            raise ValueError(
                f"The prompt ({prompt_length} tokens) and max_new_tokens={max_new_tokens} exceed the model's "
                f"context_length={limit}: shorten one of them."
            )
        return max_new_tokens
    non_negative = tf.debugging.Assert(
        max_new_tokens >= 0, ["max_new_tokens must be >= 0. Received: max_new_tokens =", max_new_tokens]
    )
    fits = tf.debugging.Assert(
        prompt_length + max_new_tokens <= limit,
        [
            f"The prompt and max_new_tokens exceed the model's context_length={limit}. Received: prompt length =",
            prompt_length,
            "max_new_tokens =",
            max_new_tokens,
        ],
    )
    with tf.control_dependencies([non_negative, fits]):
        return tf.identity(max_new_tokens)


def initial_caches(config, layers, batch_size):
    """One empty cache per block."""
    return [layers[f"block_{i}"].get_initial_cache(batch_size) for i in range(config.num_layers)]


def left_pad(prompts, pad_id=0):
    """`(ids [B, P], mask [B, P])` from a list of token-id lists, right-aligned."""
    if not len(prompts):
        raise ValueError("There are no prompts to continue. Received: prompts=[]")
    for index, prompt in enumerate(prompts):
        if not len(prompt):
            raise ValueError(
                f"Prompt {index} is empty: generation continues at least one token (for a new line of "
                f"text, the end-of-line id the training data put after every line). Received: prompts[{index}]=[]"
            )
    length = max(len(p) for p in prompts)
    ids = [[pad_id] * (length - len(p)) + list(p) for p in prompts]
    mask = [[False] * (length - len(p)) + [True] * len(p) for p in prompts]
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
        batch, prompt_length = tf.shape(ids)[0], tf.shape(ids)[1]
        max_new_tokens = check_generation_length(prompt_length, max_new_tokens, config.context_length)
        # Positions count from each prompt's first real token.
        start = -tf.reduce_sum(tf.cast(tf.logical_not(mask), tf.int32), axis=1)
        caches = initial_caches(config, layers, batch)
        for i, block in enumerate(config.blocks):
            if block == "elita":  # Attention2 tracks positions in its cache
                log_z, mean, _ = caches[i]
                caches[i] = (log_z, mean, start)
        logits, caches = decoder_forward(config, layers, ids, mask, caches, start_index=start)
        position = start + prompt_length
        token = _select(logits[:, -1], self.sampler, self.temperature, self.top_k, self.top_p, seed)
        tokens = tf.TensorArray(tf.int32, size=max_new_tokens, element_shape=tf.TensorShape([None]))

        def step(i, token, position, tokens, caches):
            tokens = tokens.write(i, token)
            logits, caches = decoder_forward(config, layers, token[:, None], None, caches, start_index=position)
            next_token = _select(logits[:, 0], self.sampler, self.temperature, self.top_k, self.top_p, seed + i + 1)
            return i + 1, next_token, position + 1, tokens, caches

        _, _, _, tokens, _ = tf.while_loop(
            lambda i, *_: i < max_new_tokens,
            step,
            (tf.constant(0), token, position, tokens, caches),
        )
        # An empty TensorArray cannot stack (its element shape is not static).
        return tf.cond(
            max_new_tokens > 0, lambda: tf.transpose(tokens.stack()), lambda: tf.zeros([batch, 0], tf.int32)
        )  # [B, max_new_tokens]

    def __call__(self, prompts, max_new_tokens, seed=0, mask=None):
        """Generates `max_new_tokens` after each prompt.

        Args:
            prompts: a list of token-id lists (any lengths), or int `[B, P]`
                left-padded ids with `mask`.
            max_new_tokens: int.
            seed: int, for the samplers.
            mask: bool `[B, P]` for padded `prompts`, False at padding.

        Returns:
            int32 `[B, max_new_tokens]`.
        """
        if mask is None:
            ids, mask = left_pad(prompts) if isinstance(prompts, (list, tuple)) else (prompts, None)
            if mask is None:
                mask = tf.ones(tf.shape(ids), tf.bool)
        else:
            ids = prompts
        ids, _ = check_token_ids(ids, self.config.vocab_size, name="prompts")
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int):
            raise TypeError(f"`max_new_tokens` must be an integer. Received: max_new_tokens={max_new_tokens!r}")
        check_generation_length(ids.shape[1], max_new_tokens, self.config.context_length)
        return self.run(
            tf.cast(ids, tf.int32), tf.cast(mask, tf.bool), tf.constant(max_new_tokens), tf.constant([seed, 0])
        )


def generate(model, config, prompts, max_new_tokens, sampler="greedy", temperature=1.0, top_k=40, top_p=0.9, seed=0):
    """Generates `max_new_tokens` tokens after each prompt (see `Generator`).

    Example:
    >>> tokens = generate(model, config, [[5, 8, 2], [7]], max_new_tokens=20)  # doctest: +SKIP
    """
    return Generator(model, config, sampler, temperature, top_k, top_p)(prompts, max_new_tokens, seed)

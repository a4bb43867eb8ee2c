"""`ElitaCausalLM`: the one model that trains, evaluates, generates and exports (keras-hub's `CausalLM`)."""

import contextlib
import warnings

import keras
import keras_hub
from keras import ops

from elita_tf import backend
from elita_tf.models.chunked_loss_training import ChunkedLossTraining, padding_mask_of
from elita_tf.models.elita_backbone import ElitaBackbone
from elita_tf.models.elita_causal_lm_preprocessor import ElitaCausalLMPreprocessor
from elita_tf.models.presets import check_preset, saved_mixed_precision
from elita_tf.ops.utils.token_ids import check_integer_ids, check_token_ids
from elita_tf.private_apis import in_symbolic_scope


def _check_max_length(max_length, limit):
    """Raises ValueError when generating `max_length` positions would pass the model's `limit` (None: none)."""
    if limit is not None and max_length > limit:
        raise ValueError(
            f"`max_length` {max_length} exceeds the {limit} positions this model's position table or decoding "
            f"buffers hold (its max_sequence_length): generate at most {limit}. Received: max_length={max_length}"
        )


def _warn_of_unknown_characters(tokenizer, prompts, ids):
    """Warns, naming them, of the prompts' characters that the tokenizer turns into `<unk>` (its ids `ids`)."""
    unknown = tokenizer.token_to_id("<unk>")
    if not hasattr(tokenizer, "unknown_characters") or not any(unknown in row for row in ids):
        return
    characters = tokenizer.unknown_characters(prompts)
    warnings.warn(
        f"The prompt's characters {', '.join(map(repr, characters))} are not in the tokenizer's vocabulary: the "
        "model reads each as <unk>, and the text shows ' ⁇ ' in its place. A tokenizer with byte pieces spells any "
        "character (elita-train --byte-fallback).",
        stacklevel=3,
    )


@keras.saving.register_keras_serializable(package="elita_tf")
class ElitaCausalLM(ChunkedLossTraining, keras_hub.models.CausalLM):
    """An ELiTA (or related) decoder language model: keras-hub's `fit`, `generate`, samplers and presets.

    **Training.** Compiled with `SparseCategoricalCrossentropy(from_logits=True)`
    and no metrics (`weighted_metrics=None`), `fit` and `evaluate` take the
    loss from the final hidden states a chunk of tokens at a time
    (`ElitaBackbone.token_losses`): the step never holds the `[B, T, V]`
    logits and their gradient (docs/math.md §10). It is the same loss, sample
    weights included, as Keras' on the logits `call` returns; any other loss
    or metric, or `chunked_loss = False`, takes Keras' own loss on the logits.
    `enable_carried_state` makes `fit` carry every block's state from batch
    to batch (truncated backpropagation through time). Both run inside
    Keras' own steps (`compute_loss`), on TensorFlow, JAX and PyTorch.

    **Generation.** `generate_step` prefills, in one parallel pass, every
    position before the shortest prompt's last token, then takes one cached
    step per position: constant-size states for ELiTA, linear and additive
    attention, ring buffers for windows, key/value buffers for softmax
    attention. Prompts are right-padded, and a row inside its prompt is fed
    its own next token, so each row continues exactly as it would alone.

    Inputs are `{"token_ids": int [B, T], "padding_mask": [B, T]}`, optionally
    with `"document_starts": bool [B, T]` (True where a new document starts; models
    whose every block keeps a constant-size state). Float token ids are
    refused, never truncated.

    Args:
        backbone: an `ElitaBackbone`.
        preprocessor: an `ElitaCausalLMPreprocessor`, or None to work on
            `{"token_ids", "padding_mask"}` directly.

    Example:
    >>> causal_lm = ElitaCausalLM.from_preset("elita-preset")  # doctest: +SKIP
    >>> causal_lm.generate("The history of", max_length=64)  # doctest: +SKIP
    >>> causal_lm.compile(sampler=keras_hub.samplers.TopKSampler(k=40))  # doctest: +SKIP
    """

    backbone_cls = ElitaBackbone
    preprocessor_cls = ElitaCausalLMPreprocessor

    def __init__(self, backbone, preprocessor=None, **kwargs):
        # === Layers ===
        self.backbone = backbone
        self.preprocessor = preprocessor
        # === Functional model ===
        inputs = backbone.input
        # The backbone's policy: under mixed_float16, `compile` then scales the loss.
        kwargs.setdefault("dtype", backbone.dtype_policy)
        super().__init__(inputs=inputs, outputs=backbone(inputs), **kwargs)

    def call(self, inputs, training=None, mask=None):
        if self.hidden_state_outputs:  # a training or test step taking the chunked loss (`compute_loss`)
            return self.hidden_states_for_loss(inputs, training)
        if isinstance(inputs, dict) and "document_starts" in inputs:  # packed documents: outside the functional graph
            backbone = self.backbone
            hidden = backbone.hidden_states(
                inputs["token_ids"],
                padding_mask_of(inputs),
                document_starts=inputs["document_starts"],
                training=training,
            )
            return backbone.logits(hidden)
        if not in_symbolic_scope() and isinstance(inputs, dict) and "token_ids" in inputs:
            check_integer_ids(inputs["token_ids"], self.backbone.vocabulary_size)
        return super().call(inputs, training=training, mask=mask)

    def generate(self, inputs, max_length=None, stop_token_ids="auto", strip_prompt=False):
        """keras-hub's `generate`, with the prompts and `max_length` checked first: no prompt is ever cut.

        `max_length` counts the prompt's tokens (with the start token) and the new ones. Left out,
        it is the preprocessor's `sequence_length`, as in keras-hub; a prompt that already fills
        that is continued whole, by `sequence_length` new tokens, where the model decodes past its
        training length (`ElitaBackbone.decode_limit` is None).

        Raises:
            ValueError: for a model that cannot decode (`position_mode="length"`), no prompts, a
                prompt id outside the vocabulary, a `max_length` below 1 or past the positions the model
                holds, or (with a preprocessor) a prompt that leaves no room for a new token.
        """
        self.backbone.check_decodes()  # here, not in the traced step, whose error Keras wraps in its frames
        if isinstance(inputs, bytes):
            inputs = inputs.decode("utf-8")
        elif isinstance(inputs, (list, tuple)):
            if not len(inputs):
                raise ValueError("There are no prompts to continue. Received: inputs=[]")
            inputs = [x.decode("utf-8") if isinstance(x, bytes) else x for x in inputs]
        if max_length is not None and (
            isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
        ):
            raise ValueError(f"`max_length` must be a positive integer. Received: max_length={max_length!r}")
        limit = self.backbone.decode_limit
        prompts = [inputs] if isinstance(inputs, str) else inputs
        if self.preprocessor is not None and isinstance(prompts, list) and all(isinstance(p, str) for p in prompts):
            # keras-hub's preprocessor would cut a longer prompt to `max_length` without a word.
            ids = self.preprocessor.tokenizer(prompts)
            ids = ids.to_list() if hasattr(ids, "to_list") else ids
            _warn_of_unknown_characters(self.preprocessor.tokenizer, prompts, ids)
            longest = max(len(row) for row in ids) + 1  # with the start token
            if limit is not None and longest >= limit:
                raise ValueError(
                    f"The longest prompt holds {longest} tokens (with the start token), and this model reads at most "
                    f"{limit} positions (its max_sequence_length), which leaves no room for a new token: shorten "
                    f"the prompt. Received: {len(prompts)} prompts"
                )
            if max_length is None:
                max_length = self.preprocessor.sequence_length
                if longest >= max_length:
                    max_length = longest + max_length if limit is None else limit
            elif longest >= max_length:
                raise ValueError(
                    f"`max_length` counts the prompt's tokens too: the longest prompt holds {longest} (with the "
                    f"start token), which leaves no room for a new token. Received: max_length={max_length}"
                )
        if isinstance(inputs, dict) and "token_ids" in inputs:
            # A prompt's values are always known here; inside the compiled step (`jax.jit`) a bad id would only
            # embed to NaN, which the sampler's argmax reads as token 0.
            check_token_ids(inputs["token_ids"], self.backbone.vocabulary_size)
            if self.preprocessor is None:
                max_length = ops.shape(inputs["token_ids"])[-1]  # padded prompts: their width is the length
        if max_length is not None:
            _check_max_length(max_length, limit)
        return super().generate(inputs, max_length=max_length, stop_token_ids=stop_token_ids, strip_prompt=strip_prompt)

    def score(self, token_ids, padding_mask=None, scoring_mode="logits", layer_intercept_fn=None, target_ids=None):
        """Scores token ids as keras-hub's causal LMs do: per-token logits, or per-token losses; also text.

        Text (a string or a list of strings) goes through the preprocessor as
        training text does: each string a line, the end-of-line piece before
        and after it, padded on the right to the longest. Position `t` then
        scores the token at `t + 1`; with `"loss"` the losses at padding are
        0, so a row's sum is the negative log-likelihood of its text and its
        end-of-line piece.

        Args:
            token_ids: int `[B, T]`, e.g. a prompt and its generated tokens,
                or text: a string or a list of strings.
            padding_mask: optional `[B, T]`, False (0) at padding; None: all real.
            scoring_mode: `"logits"` (`[B, T, V]`, compute dtype) or `"loss"`
                (`[B, T]` float32 cross-entropy of `target_ids`, taken from the
                head a chunk of tokens at a time).
            layer_intercept_fn: optional `f(x, i) -> x` that sees (and may
                replace) the embedded tokens (`i = -1`) and each block's output
                (`i = 0, 1, ...`), e.g. to take gradients with respect to them.
            target_ids: int `[B, T]`, the token each position should predict
                (usually `token_ids` shifted left by one); needed for `"loss"`.

        Example:
        >>> ids = ops.convert_to_tensor([[5, 9, 14, 3]])
        >>> losses = causal_lm.score(ids, scoring_mode="loss", target_ids=ops.roll(ids, -1, axis=1))  # doctest: +SKIP
        >>> nll = ops.sum(causal_lm.score(["The cat sat ."], scoring_mode="loss"), axis=1)  # doctest: +SKIP
        """
        if scoring_mode not in ("logits", "loss"):
            raise ValueError(f"`scoring_mode` must be 'logits' or 'loss'. Received: scoring_mode={scoring_mode!r}")
        if isinstance(token_ids, (list, tuple)) and not len(token_ids):
            raise ValueError(
                "There is nothing to score: pass a string, a list of strings or token ids [B, T]. "
                "Received: token_ids=[]"
            )
        if isinstance(token_ids, str) or (
            isinstance(token_ids, (list, tuple)) and all(isinstance(t, str) for t in token_ids)
        ):
            return self._score_text(token_ids, padding_mask, scoring_mode, layer_intercept_fn, target_ids)
        if scoring_mode == "loss" and target_ids is None:
            raise ValueError("scoring_mode='loss' needs `target_ids`, the token each position should predict.")
        if padding_mask is not None:
            padding_mask = ops.cast(padding_mask, "bool")
        backbone = self.backbone
        # Scores are values, not the start of a backward pass (PyTorch would keep the whole graph for one), unless
        # `layer_intercept_fn` is there to take gradients.
        with backend.no_gradient() if layer_intercept_fn is None else contextlib.nullcontext():
            hidden = backbone.hidden_states(token_ids, padding_mask, intercept=layer_intercept_fn)
            if scoring_mode == "logits":
                return backbone.logits(hidden)
            return backbone.token_losses(hidden, target_ids)

    def _score_text(self, texts, padding_mask, scoring_mode, layer_intercept_fn, target_ids):
        if self.preprocessor is None:
            raise ValueError("Scoring text needs a preprocessor: this model has none. Pass token ids instead.")
        if padding_mask is not None or target_ids is not None:
            raise ValueError(
                "Text is scored against its own next tokens, padded by the preprocessor: leave `padding_mask` and "
                f"`target_ids` out. Received: padding_mask={padding_mask!r}, target_ids={target_ids!r}"
            )
        texts = [texts] if isinstance(texts, str) else list(texts)
        ids = self.preprocessor.tokenizer(texts)
        longest = max(len(row) for row in (ids.to_list() if hasattr(ids, "to_list") else ids))
        length = longest + 1  # the start piece and the tokens; their targets add the end piece
        limit = self.backbone.decode_limit
        if limit is not None and length > limit:
            raise ValueError(
                f"The longest text holds {longest} tokens, and this model reads at most {limit} positions. "
                f"Received: {len(texts)} texts"
            )
        x, labels, weights = self.preprocessor(texts, sequence_length=length)
        if scoring_mode == "logits":
            return self.score(x["token_ids"], x["padding_mask"], "logits", layer_intercept_fn)
        losses = self.score(x["token_ids"], x["padding_mask"], "loss", layer_intercept_fn, labels)
        return losses * ops.cast(weights, losses.dtype)

    def call_with_cache(self, token_ids, cache, padding_mask=None):
        """Continues the sequence `cache` summarises with `token_ids [B, T]`.

        Args:
            token_ids: int `[B, T]`.
            cache: from `backbone.get_initial_cache` or a previous call.
            padding_mask: optional bool `[B, T]`; positions after a row's last
                real one (right padding) are left out of its cache.

        Returns:
            `(logits [B, T, V], hidden_states [B, T, d], cache)`.
        """
        hidden, cache = self.backbone.hidden_states(token_ids, padding_mask, cache=cache)
        return self.backbone.logits(hidden), hidden, cache

    def generate_step(self, inputs, stop_token_ids=None):
        """Fills the unmasked positions of `{"token_ids", "padding_mask"}` (right-padded prompts); XLA-compilable."""
        token_ids, padding_mask = inputs["token_ids"], ops.cast(inputs["padding_mask"], "bool")
        backbone = self.backbone
        limit = backbone.decode_limit
        batch_size, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
        if isinstance(length, int):
            _check_max_length(length, limit)
        row_lengths = ops.sum(ops.cast(padding_mask, "int32"), axis=1)
        index = ops.min(row_lengths)
        # A row with no token has nothing to continue from (the preprocessor always adds the start token).
        # `index` is read only once the check passed: the decoding loop's first slice would fail before it.
        checked = backend.check_less_equal(
            1, index, "Every prompt needs at least one token: padding_mask has a row with none"
        )
        index = backend.ordered([checked], lambda: ops.copy(index))
        # One parallel pass over every position before the shortest prompt's last token; hidden states
        # only, since its logits (`[B, max_length, V]`) would be computed and thrown away.
        prefill_mask = ops.tile(ops.arange(length)[None, :] < index - 1, [batch_size, 1])
        hidden_states, cache = backbone.hidden_states(
            token_ids, prefill_mask, cache=backbone.get_initial_cache(batch_size)
        )

        def next(prompt, cache, index):
            # The prompt's own rows: beam and contrastive search widen the batch beyond `batch_size`.
            token = ops.slice(prompt, [0, index - 1], [ops.shape(prompt)[0], 1])
            logits, hidden_states, cache = self.call_with_cache(token, cache)
            return ops.squeeze(logits, axis=1), ops.squeeze(hidden_states, axis=1), cache

        token_ids = self.sampler(
            next=next,
            prompt=token_ids,
            cache=cache,
            index=index,
            mask=padding_mask,
            stop_token_ids=stop_token_ids,
            hidden_states=hidden_states,
            model=self,
        )
        if stop_token_ids is not None:
            # Everything after the first stop token past each prompt is padding.
            stops = ops.zeros_like(padding_mask)
            for stop_token_id in stop_token_ids:
                stops = ops.logical_or(stops, ops.equal(token_ids, stop_token_id))
            stops = ops.cast(ops.logical_and(stops, ops.logical_not(padding_mask)), "int32")
            padding_mask = ops.equal(ops.cumsum(stops, axis=1) - stops, 0)
        else:
            padding_mask = ops.ones_like(token_ids, dtype="bool")
        return {"token_ids": token_ids, "padding_mask": padding_mask}

    def compile(self, optimizer="auto", loss="auto", *, weighted_metrics="auto", sampler="top_k", **kwargs):
        """keras-hub's `compile`; `weighted_metrics=None` (and no `metrics`) trains on the loss alone.

        The `"auto"` loss is keras-hub's, the cross-entropy of the logits, averaged over the weighted
        tokens: a padded position, or a packed document's first token, weighs 0 and counts for nothing.

        Raises:
            ValueError: for a `sampler` that names no keras-hub sampler.
        """
        resolved = keras_hub.samplers.get(sampler)
        if not isinstance(resolved, keras_hub.samplers.Sampler):
            raise ValueError(
                "`sampler` must be a keras_hub.samplers.Sampler or the name of one: 'beam', 'contrastive', "
                f"'greedy', 'random', 'top_k' or 'top_p'. Received: sampler={sampler!r}"
            )
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="mean_with_sample_weight")
        super().compile(optimizer, loss, weighted_metrics=weighted_metrics, sampler=resolved, **kwargs)
        if weighted_metrics is None and kwargs.get("metrics") is None:
            # Keras keeps the metrics of an earlier compile (keras-hub compiles every task when made).
            self._compile_metrics = None

    @classmethod
    def from_preset(cls, preset, load_weights=True, **kwargs):
        """keras-hub's `from_preset`: a preset directory or a `kaggle://` or `hf://` handle, checked first.

        A mixed-precision preset loads in its policy, or in the `dtype` given (`dtype="float32"`).
        """
        preset = check_preset(preset, load_weights)
        if kwargs.get("dtype") is None:
            kwargs["dtype"] = saved_mixed_precision(preset)
        return super().from_preset(preset, load_weights=load_weights, **kwargs)

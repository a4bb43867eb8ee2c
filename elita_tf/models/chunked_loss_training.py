"""How `ElitaCausalLM` trains: the loss taken a chunk of tokens at a time, and a state carried between batches.

keras-hub's `CausalLM` trains on the `[B, T, V]` logits its `call` returns. `ChunkedLossTraining`
takes the same loss from the final hidden states instead (`ElitaBackbone.token_losses`), so that no
step holds the logits and their gradient, and, with `enable_carried_state`, continues every
block's decoding state from one batch to the next (truncated backpropagation through time).

It runs inside Keras' own training and test steps, on every backend: while a step is traced, `call`
returns the final hidden states, and `compute_loss` (as keras-hub's PARSeq overrides it) takes the
loss from them. The carried state is the model's own non-trainable variables, which Keras threads
through a JAX step as it does a normalisation's statistics. The causal LM itself keeps to
generation and scoring.
"""

import contextlib
import sys

import keras
from keras import ops

from elita_tf.private_apis import scale_loss_for_distribution, unscale_loss_for_distribution


def padding_mask_of(inputs):
    """`inputs["padding_mask"]` as bool, or None."""
    mask = inputs.get("padding_mask")
    return None if mask is None else ops.cast(mask, "bool")


def _distributed(dataset):
    """Whether `dataset` is a `tf.distribute` dataset (TensorFlow is not imported to find out)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(dataset, tf.distribute.DistributedDataset)


class ChunkedLossTraining:
    """`fit` and `evaluate` of a keras-hub `CausalLM` whose backbone has `hidden_states` and `token_losses`.

    Compiled with `SparseCategoricalCrossentropy(from_logits=True)` and no
    metrics (`weighted_metrics=None`), the training and test steps take the
    loss from the final hidden states a chunk of tokens at a time: the same
    loss, sample weights included, as Keras' on the logits. Any other loss or
    metric, or `chunked_loss = False`, takes Keras' own loss on the logits.
    """

    carried_state = None  # the cache `fit` carries from batch to batch (`enable_carried_state`)
    chunked_loss = True  # False: Keras' own loss on the full logits (to compare with it)
    hidden_state_outputs = False  # True while a step taking the chunked loss is traced: `call` gives hidden states

    def fit(self, x=None, *args, **kwargs):
        if self.carried_state is not None and not self._chunked_loss_applies():
            raise ValueError(
                "With a carried state, `fit` computes the loss itself: compile with "
                "SparseCategoricalCrossentropy(from_logits=True) and no metrics (weighted_metrics=None). "
                f"Received: loss={self.loss!r}"
            )
        if _distributed(x):  # keras-hub's preprocessing cannot wrap one
            return keras.Model.fit(self, x, *args, **kwargs)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        if _distributed(x):
            return keras.Model.evaluate(self, x, *args, **kwargs)
        return super().evaluate(x, *args, **kwargs)

    def compile_from_config(self, config):
        """Keras' own: a checkpoint loads compiled, with its optimizer (Keras skips a custom `compile`)."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        self._build_optimizer()

    def make_train_function(self, force=False):
        if self.train_function is None or force:
            # Keras otherwise builds the optimizer inside the first traced step, and TensorFlow traces a
            # function that makes variables twice: building it here halves the first step's tracing.
            self._build_optimizer()
        return super().make_train_function(force)

    def _build_optimizer(self):
        if self.built and self.optimizer is not None and not self.optimizer.built:
            strategy = getattr(self, "distribute_strategy", None)  # TensorFlow's
            with contextlib.nullcontext() if strategy is None else strategy.scope():
                self.optimizer.build(self.trainable_variables)

    def enable_carried_state(self, batch_size):
        """Makes `fit` carry every block's decoding state from one batch to the next.

        Truncated backpropagation through time: `fit` then takes batches
        `({"token_ids", "padding_mask", "document_starts"}, labels)` of consecutive
        segments of `batch_size` streams (`elita_tf.data.stream_dataset`). Each
        step continues from the state the previous one left (a constant, with
        no gradient: gradients stop at segment boundaries), and no position
        sees anything before its document's start (`document_starts`). The state is
        saved with the model, so a resumed run continues exactly.

        Raises:
            ValueError: for a model that cannot carry its state
                (`ElitaBackbone.carries_state`).
        """
        self.backbone.check_carries_state()
        cache = self.backbone.get_initial_cache(batch_size)
        variables = [
            self.add_weight(
                shape=value.shape,
                dtype=keras.backend.standardize_dtype(value.dtype),
                initializer=lambda shape, dtype, value=value: value,
                trainable=False,
                name="carried_state_" + "_".join(map(str, path)),
            )
            for path, value in keras.tree.flatten_with_path(cache)
        ]
        self.carried_state = keras.tree.pack_sequence_as(cache, variables)

    def _chunked_loss_applies(self):
        loss = getattr(self, "loss", None)
        if not self.chunked_loss or self._compile_metrics is not None:
            return False
        if not isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
            return False
        loss_config = loss.get_config()
        return (
            loss_config["from_logits"]
            and loss_config.get("ignore_class") is None
            and loss_config["reduction"] in ("sum_over_batch_size", "mean_with_sample_weight")
        )

    @contextlib.contextmanager
    def _hidden_state_outputs(self):
        """While Keras traces a step: `call` gives the final hidden states where the chunked loss applies."""
        previous, self.hidden_state_outputs = self.hidden_state_outputs, self._chunked_loss_applies()
        try:
            yield
        finally:
            self.hidden_state_outputs = previous

    def train_step(self, *args):
        with self._hidden_state_outputs():
            return super().train_step(*args)

    def test_step(self, *args):
        with self._hidden_state_outputs():
            return super().test_step(*args)

    def hidden_states_for_loss(self, x, training):
        """The final hidden states `compute_loss` takes the loss from; in `fit` with a carried state, continued
        from it, which they update."""
        backbone = self.backbone
        token_ids, padding_mask = x["token_ids"], padding_mask_of(x)
        if not training or self.carried_state is None:  # only `fit` carries the state
            return backbone.hidden_states(
                token_ids, padding_mask, document_starts=x.get("document_starts"), training=training
            )
        if "document_starts" not in x:
            raise ValueError(
                "With a carried state, `fit` takes `({'token_ids', 'padding_mask', 'document_starts'}, labels)` "
                f"batches (elita_tf.data.stream_dataset). Received: inputs {x!r}"
            )
        cache = keras.tree.map_structure(ops.convert_to_tensor, self.carried_state)  # read: no gradient reaches it
        hidden, cache = backbone.hidden_states(
            token_ids, padding_mask, cache=cache, document_starts=x["document_starts"], training=training
        )
        for variable, value in zip(keras.tree.flatten(self.carried_state), keras.tree.flatten(cache)):
            variable.assign(value)
        return hidden

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """Keras' loss of the step from the hidden states `y_pred`, as Keras computes a compiled loss (sample
        weights, regularisers, replicas), where the chunked loss applies; Keras' own elsewhere."""
        if not self.hidden_state_outputs:
            return super().compute_loss(x, y, y_pred, sample_weight, training=training)
        backbone = self.backbone
        # Keras' reductions: the weighted sum over every token, divided by their number ("sum_over_batch_size")
        # or by the sum of the weights ("mean_with_sample_weight": packed documents weigh out the first token of
        # each). Training takes the sum from the head, which then forms its gradients in the forward pass.
        if training:
            loss = backbone.token_losses(y_pred, y, sample_weight, reduction="sum")
        else:
            loss = ops.sum(backbone.token_losses(y_pred, y, sample_weight))
        if self._weighs_by_samples(sample_weight):
            divisor = ops.sum(ops.cast(sample_weight, loss.dtype))
        else:
            divisor = ops.cast(ops.size(y), loss.dtype)
        loss = ops.divide_no_nan(loss, divisor)
        for extra in self.losses:  # regularisers, as Keras' `compute_loss` adds them
            loss = loss + ops.cast(ops.sum(extra), loss.dtype)
        loss = scale_loss_for_distribution(loss)
        if not training and self._weighs_by_samples(sample_weight):
            # Keras' step adds each batch's loss to its "loss" weighed by the batch's rows. Evaluation's figure is
            # the mean over every weighted token (packed documents): weighed by the weights' sum, the rest here.
            rows = ops.cast(ops.shape(y)[0], loss.dtype)
            self._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=divisor - rows)
        return loss

    def _weighs_by_samples(self, sample_weight):
        """Whether the loss is averaged over the weights of `sample_weight` rather than over every token."""
        return sample_weight is not None and self.loss.get_config()["reduction"] == "mean_with_sample_weight"

    def save_own_variables(self, store):
        # The model's own variables are the carried state's alone, stored under names that say so.
        for i, variable in enumerate(keras.tree.flatten(self.carried_state or {})):
            store[f"carried_state_{i}"] = ops.convert_to_numpy(variable)

    def load_own_variables(self, store):
        for i, variable in enumerate(keras.tree.flatten(self.carried_state or {})):
            variable.assign(store[f"carried_state_{i}"])

    def get_config(self):
        config = super().get_config()
        if self.carried_state is not None:
            config["carried_state_batch_size"] = int(self.carried_state["position"].shape[0])
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        carried_batch_size = config.pop("carried_state_batch_size", None)
        model = super().from_config(config)
        if carried_batch_size is not None:
            model.enable_carried_state(carried_batch_size)
        return model

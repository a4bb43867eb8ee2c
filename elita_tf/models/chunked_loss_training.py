"""How `ElitaCausalLM` trains: the loss taken a chunk of tokens at a time, and a state carried between batches.

keras-hub's `CausalLM` trains on the `[B, T, V]` logits its `call` returns. `ChunkedLossTraining`
takes the same loss from the final hidden states instead (`ElitaBackbone.token_losses`), so that no
step holds the logits and their gradient, and, with `enable_carried_state`, continues every
block's decoding state from one batch to the next (truncated backpropagation through time). The
causal LM itself keeps to generation and scoring.
"""

import keras
import tensorflow as tf
from keras import ops


def padding_mask_of(inputs):
    """`inputs["padding_mask"]` as bool, or None."""
    mask = inputs.get("padding_mask")
    return None if mask is None else ops.cast(mask, "bool")


class ChunkedLossTraining:
    """`fit` and `evaluate` of a keras-hub `CausalLM` whose backbone has `hidden_states` and `token_losses`.

    Compiled with `SparseCategoricalCrossentropy(from_logits=True)` and no
    metrics (`weighted_metrics=None`), the training and test steps take the
    loss from the final hidden states a chunk of tokens at a time: the same
    loss, sample weights included, as Keras' on the logits. Any other loss or
    metric, or `chunked_loss = False`, takes Keras' own step.
    """

    carried_state = None  # the cache `fit` carries from batch to batch (`enable_carried_state`)
    chunked_loss = True  # False: Keras' own step on the full logits (to compare with it)

    def fit(self, x=None, *args, **kwargs):
        if isinstance(x, tf.distribute.DistributedDataset):  # keras-hub's preprocessing cannot wrap one
            return keras.Model.fit(self, x, *args, **kwargs)
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        if isinstance(x, tf.distribute.DistributedDataset):
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
            with self.distribute_strategy.scope():
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
        with tf.init_scope():
            self.carried_state = tf.nest.map_structure(lambda t: tf.Variable(t, trainable=False), cache)

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

    def _chunked_loss(self, x, labels, sample_weight, training, carry=False):
        """The batch's mean loss, as Keras computes a compiled loss (sample weights, regularisers, replicas).

        With `carry`, the forward continues from the carried state and updates it.
        """
        backbone = self.backbone
        token_ids, padding_mask = x["token_ids"], padding_mask_of(x)
        if not carry:
            hidden = backbone.hidden_states(
                token_ids, padding_mask, document_starts=x.get("document_starts"), training=training
            )
        else:
            cache = tf.nest.map_structure(lambda v: v.read_value(), self.carried_state)
            hidden, cache = backbone.hidden_states(
                token_ids, padding_mask, cache=cache, document_starts=x["document_starts"], training=training
            )
            tf.nest.map_structure(lambda v, t: v.assign(t), self.carried_state, cache)
        # Keras' reductions: the weighted sum over every token, divided by their number ("sum_over_batch_size")
        # or by the sum of the weights ("mean_with_sample_weight": packed documents weigh out the first token of
        # each). Training takes the sum from the head, which then forms its gradients in the forward pass.
        if training:
            loss = backbone.token_losses(hidden, labels, sample_weight, reduction="sum")
        else:
            loss = ops.sum(backbone.token_losses(hidden, labels, sample_weight))
        if self._weighs_by_samples(sample_weight):
            divisor = tf.reduce_sum(tf.cast(sample_weight, loss.dtype))
        else:
            divisor = tf.cast(tf.size(labels), loss.dtype)
        loss = tf.math.divide_no_nan(loss, divisor)
        for extra in self.losses:  # regularisers, as `compute_loss` adds them
            loss = loss + ops.cast(ops.sum(extra), loss.dtype)
        return loss / tf.distribute.get_strategy().num_replicas_in_sync

    def _weighs_by_samples(self, sample_weight):
        """Whether the loss is averaged over the weights of `sample_weight` rather than over every token."""
        return sample_weight is not None and self.loss.get_config()["reduction"] == "mean_with_sample_weight"

    def _track_loss(self, loss, token_ids, sample_weight=None):
        # Each batch's mean weighs in by its rows, or, given `sample_weight` with a loss averaged over the
        # weights, by their sum: evaluation's figure is then the mean over every weighted token (packed
        # documents). Training keeps rows: `StepLog` reads each batch's loss back from the running mean.
        replicas = tf.distribute.get_strategy().num_replicas_in_sync
        weight = tf.cast(tf.shape(token_ids)[0], loss.dtype)
        if self._weighs_by_samples(sample_weight):
            weight = tf.reduce_sum(tf.cast(sample_weight, loss.dtype))
        self._loss_tracker.update_state(loss * replicas, sample_weight=weight)

    def train_step(self, data):
        x, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if not self._chunked_loss_applies():
            if self.carried_state is not None:
                raise ValueError(
                    "With a carried state, `fit` computes the loss itself: compile with "
                    "SparseCategoricalCrossentropy(from_logits=True) and no metrics (weighted_metrics=None). "
                    f"Received: loss={self.loss!r}"
                )
            return super().train_step(data)
        if self.carried_state is not None and not (isinstance(x, dict) and "document_starts" in x):
            raise ValueError(
                "With a carried state, `fit` takes `({'token_ids', 'padding_mask', 'document_starts'}, labels)` "
                "batches "
                f"(elita_tf.data.stream_dataset). Received: inputs {x!r}"
            )
        with tf.GradientTape() as tape:
            loss = self._chunked_loss(x, labels, sample_weight, training=True, carry=self.carried_state is not None)
            self._track_loss(loss, x["token_ids"])
            scaled = self.optimizer.scale_loss(loss)
        gradients = tape.gradient(scaled, self.trainable_weights)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_weights))
        return self.get_metrics_result()

    def test_step(self, data):
        x, labels, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if not self._chunked_loss_applies():
            return super().test_step(data)
        loss = self._chunked_loss(x, labels, sample_weight, training=False)
        self._track_loss(loss, x["token_ids"], sample_weight)
        return self.get_metrics_result()

    def save_own_variables(self, store):
        super().save_own_variables(store)
        for i, variable in enumerate(tf.nest.flatten(self.carried_state or {})):
            store[f"carried_state_{i}"] = variable.numpy()

    def load_own_variables(self, store):
        carried = {key for key in store.keys() if key.startswith("carried_state_")}
        super().load_own_variables({key: store[key] for key in store.keys() if key not in carried})
        for i, variable in enumerate(tf.nest.flatten(self.carried_state or {})):
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

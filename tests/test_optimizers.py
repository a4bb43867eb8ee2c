import keras
import numpy as np
import pytest
import tensorflow as tf

from elita_tf.optimizers import NormalizedSGD


def _variables(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "kernel": keras.Variable(rng.normal(size=(5, 3)), dtype="float32", name="kernel"),
        "bias": keras.Variable(rng.normal(size=(3,)), dtype="float32", name="bias"),
        "embedding": keras.Variable(rng.normal(size=(6, 4)), dtype="float32", name="embedding"),
    }


def _gradients(variables, seed=1):
    rng = np.random.default_rng(seed)
    return {name: tf.constant(rng.normal(size=v.shape) * 7.0, tf.float32) for name, v in variables.items()}


def test_every_matrix_and_vector_moves_by_exactly_lr():
    variables = _variables()
    optimizer = NormalizedSGD(learning_rate=0.05)
    for step in range(3):
        before = {name: v.numpy() for name, v in variables.items()}
        grads = _gradients(variables, seed=step)
        optimizer.apply_gradients([(grads[n], variables[n]) for n in variables])
        for name, v in variables.items():
            delta = v.numpy() - before[name]
            np.testing.assert_allclose(np.linalg.norm(delta), 0.05, rtol=1e-5)
            # Along -g: descent on the loss.
            np.testing.assert_allclose(delta, -0.05 * grads[name] / np.linalg.norm(grads[name]), rtol=1e-5, atol=1e-7)


def test_zero_gradient_is_skipped():
    variables = _variables()
    before = variables["kernel"].numpy()
    NormalizedSGD().apply_gradients([(tf.zeros([5, 3]), variables["kernel"])])
    np.testing.assert_array_equal(variables["kernel"].numpy(), before)


def test_row_normalised_update_matches_its_definition():
    variables = _variables()
    optimizer = NormalizedSGD(learning_rate=0.1, row_decay=0.9, row_normalized=["embed"])
    table = variables["embedding"]
    d, n = np.zeros(6), 0.0
    rng = np.random.default_rng(3)
    for step in range(4):
        grad = rng.normal(size=(6, 4)) * rng.uniform(0.1, 10.0, size=(6, 1))
        grad[step] = 0.0  # a row absent from this batch
        before = table.numpy()
        optimizer.apply_gradients([(tf.constant(grad, tf.float32), table)])
        d, n = 0.9 * d + (grad**2).sum(-1), 0.9 * n + 1.0
        want = before - 0.1 * np.divide(grad, np.sqrt(d / n)[:, None], out=np.zeros_like(grad), where=d[:, None] > 0)
        np.testing.assert_allclose(table.numpy(), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(table.numpy()[step], before[step])  # absent: unchanged
        if step == 0:  # D_y / n = |g_y|^2: every present row moves by exactly lr
            np.testing.assert_allclose(np.linalg.norm(table.numpy() - before, axis=1)[1:], 0.1, rtol=1e-5)
    assert optimizer._row_axis(variables["kernel"]) is None


@pytest.mark.tf_only  # IndexedSlices gradients
def test_sparse_embedding_gradients_and_column_rows():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    logits = keras.layers.Dense(5, name="final")(keras.layers.Embedding(10, 4, name="embedding")(tokens))
    model = keras.Model(tokens, logits)
    optimizer = NormalizedSGD(0.1, row_normalized={"embedding": 0, "final/kernel": -1})
    embeddings = model.get_layer("embedding").embeddings
    kernel = model.get_layer("final").kernel
    before_e, before_k = embeddings.numpy(), kernel.numpy()
    ids = np.array([[1, 2, 2, 7]])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(ids % 5, model(ids), from_logits=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert any(isinstance(g, tf.IndexedSlices) for g in grads)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    moved = np.linalg.norm(embeddings.numpy() - before_e, axis=1)
    np.testing.assert_allclose(moved[[1, 2, 7]], 0.1, rtol=1e-5)
    np.testing.assert_array_equal(moved[[0, 3, 4, 5, 6, 8, 9]], 0.0)
    # Kernel [dim, vocab]: each class column moves by lr on the first step.
    np.testing.assert_allclose(np.linalg.norm(kernel.numpy() - before_k, axis=0), 0.1, rtol=1e-5)
    bias = model.get_layer("final").bias
    assert optimizer._row_axis(bias) is None


@pytest.mark.tf_only  # its loop takes gradients with a GradientTape; test_fits_a_softmax_classifier_with_fit is Keras'
def test_fits_linear_regression():
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(256, 8)), tf.float32)
    w_true = rng.normal(size=(8, 2))
    y = x @ tf.constant(w_true, tf.float32)
    w = keras.Variable(np.zeros((8, 2)), dtype="float32", name="w")
    # Constant-norm steps only reach the optimum if lr decays (3Lin's `tailN` does, linearly).
    optimizer = NormalizedSGD(learning_rate=keras.optimizers.schedules.PolynomialDecay(0.1, 100, 0.0))

    def loss_fn():
        return tf.reduce_mean(tf.square(x @ w - y))

    initial = float(loss_fn())
    for _ in range(100):
        with tf.GradientTape() as tape:
            loss = loss_fn()
        optimizer.apply_gradients([(tape.gradient(loss, w), w)])
    assert float(loss_fn()) < initial / 1e4  # measured: 10.8 -> 1.5e-7


def test_fits_a_softmax_classifier_with_fit():
    keras.utils.set_random_seed(0)
    tokens = keras.Input((None,), dtype="int32")
    hidden = keras.layers.Embedding(32, 16, name="embedding")(tokens)
    logits = keras.layers.Dense(4, name="final")(keras.layers.Dense(16, activation="relu")(hidden))
    model = keras.Model(tokens, logits)
    model.compile(
        NormalizedSGD(0.1, row_normalized={"embedding": 0, "final/kernel": -1}),
        keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    ids = np.random.default_rng(5).integers(0, 32, size=(512, 4))
    history = model.fit(ids, (ids * 7 + 3) % 4, batch_size=64, epochs=13, verbose=0)  # 104 steps
    assert history.history["loss"][-1] < history.history["loss"][0] / 100  # measured: 0.94 -> 0.0


def test_config_round_trip_and_save(tmp_path):
    optimizer = NormalizedSGD(
        learning_rate=0.03, row_decay=0.95, row_normalized={"embedding": 0, "final": -1}, clipnorm=2.0, name="nsgd"
    )
    config = optimizer.get_config()
    restored = NormalizedSGD.from_config(config)
    assert restored.get_config() == config
    assert restored.row_decay == 0.95 and restored.clipnorm == 2.0
    assert restored.row_normalized == {"embedding": 0, "final": -1}
    listed = NormalizedSGD(row_normalized=["embedding"])
    assert NormalizedSGD.from_config(listed.get_config()).row_normalized == ["embedding"]
    assert isinstance(keras.optimizers.deserialize(keras.optimizers.serialize(optimizer)), NormalizedSGD)

    tokens = keras.Input((None,), dtype="int32")
    model = keras.Model(tokens, keras.layers.Dense(3)(keras.layers.Embedding(8, 4, name="embedding")(tokens)))
    model.compile(NormalizedSGD(row_normalized=["embedding"]), "sparse_categorical_crossentropy")
    model.fit(np.ones((4, 2), "int32"), np.ones((4, 2), "int32"), verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    assert isinstance(loaded.optimizer, NormalizedSGD)
    for a, b in zip(model.optimizer.variables, loaded.optimizer.variables):
        np.testing.assert_array_equal(a, b)


def test_bad_arguments():
    with pytest.raises(ValueError, match="Received: row_decay=1.0"):
        NormalizedSGD(row_decay=1.0)
    with pytest.raises(ValueError, match="Received: row_normalized='embedding'"):
        NormalizedSGD(row_normalized="embedding")
    with pytest.raises(ValueError, match="out of range"):
        NormalizedSGD(row_normalized={"kernel": 2}).build([_variables()["kernel"]])

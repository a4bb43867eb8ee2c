import keras
from keras import ops

from elita_tf.checks import check_integer
from elita_tf.layers.checks import check_sequence_call, input_width
from elita_tf.layers.initializers import clone_initializer
from elita_tf.layers.renamed_arguments import UpgradesRenamedArguments
from elita_tf.ops.pairwise_projection import pairwise_product, pairwise_projection


@keras.saving.register_keras_serializable(package="elita_tf")
class FeedForward2(UpgradesRenamedArguments, keras.layers.Layer):
    """ELiTA's trilinear feed-forward layer (`FeedForward2`).

    Two swish branches of widths `a = intermediate_dim` and `b = factor` are
    multiplied pairwise and mixed back to the input width `d`:

        α = swish(x W1 + b1)            # [..., a]
        β = swish(x W2 + b2)            # [..., b]
        y = Σ_ij α_i β_j W3[i, j, :] + b3

    i.e. an MLP with `a * b` hidden units whose unit `(i, j)` is the product
    `α_i β_j`. It is computed as one outer product and one matrix product.

    Args:
        intermediate_dim: int or None. Width `a` of the first branch. Defaults to
            the input width.
        factor: int. Width `b` of the second branch. Defaults to `8`.
        kernel_initializer: initializer for `w1`, `w2`, `w3`. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer for `b1`, `b2`, `b3`. Defaults to
            `"zeros"`.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: ignored (position-wise); accepted for a uniform block API.
        training: ignored.

    Returns:
        `outputs [B, T, d]`.

    Example:
    >>> layer = FeedForward2(factor=8)
    >>> keras.ops.shape(layer(keras.ops.zeros((2, 10, 16))))
    (2, 10, 16)

    References:
        - [ELiTA, A. C. O. Sharma](https://github.com/acosharma/elita-transformer)
    """

    def __init__(
        self,
        intermediate_dim=None,
        factor=8,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_integer("intermediate_dim", intermediate_dim, optional=True)
        check_integer("factor", factor)
        self.intermediate_dim = intermediate_dim
        self.factor = factor
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = True

    def build(self, inputs_shape):
        width = input_width(inputs_shape)
        a = self.intermediate_dim or width
        b = self.factor

        # Dense and EinsumDense layers, so that Keras' int8 quantization and LoRA cover them.
        def dense(name, units):
            layer = keras.layers.Dense(
                units,  # no activation: the swish is applied with the product (see `call`)
                kernel_initializer=clone_initializer(self.kernel_initializer),
                bias_initializer=clone_initializer(self.bias_initializer),
                name=name,
                dtype=self.dtype_policy,
            )
            layer.build((None, width))
            return layer

        self.w1_dense, self.w2_dense = dense("w1", a), dense("w2", b)
        self.w3_dense = keras.layers.EinsumDense(
            "nab,abw->nw",
            output_shape=(width,),
            bias_axes="w",
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            name="w3",
            dtype=self.dtype_policy,
        )
        self.w3_dense.build((None, a, b))
        self.input_spec = keras.layers.InputSpec(ndim=3, axes={-1: width})

    # The documented weights are the sublayers' kernels and biases.
    @property
    def w1(self):
        return self.w1_dense.kernel

    @property
    def b1(self):
        return self.w1_dense.bias

    @property
    def w2(self):
        return self.w2_dense.kernel

    @property
    def b2(self):
        return self.w2_dense.bias

    @property
    def w3(self):
        return self.w3_dense.kernel

    @property
    def b3(self):
        return self.w3_dense.bias

    def call(self, inputs, padding_mask=None, training=None):
        inputs, _ = check_sequence_call(self, inputs, padding_mask)
        width = inputs.shape[-1]
        x = ops.reshape(inputs, (-1, width))  # [B*T, d]: plain 2-D matrix products
        alpha = self.w1_dense(x)  # [B*T, a], before its swish
        beta = self.w2_dense(x)  # [B*T, b], before its swish
        if self.w3_dense.quantization_mode is None:
            # `kernel` includes a LoRA update; the fused form keeps no [B*T, a, b] product for the gradient,
            # and takes the swish itself, so that only the pre-activations are held for the gradient.
            kernel = ops.cast(self.w3_dense.kernel, alpha.dtype)
            outputs = pairwise_projection(alpha, beta, kernel, swish=True) + ops.cast(self.w3_dense.bias, alpha.dtype)
        else:  # int8 weights: the quantized layer's own call
            outputs = self.w3_dense(pairwise_product(ops.silu(alpha), ops.silu(beta)))  # [B*T, a, b] -> [B*T, d]
        return ops.reshape(outputs, ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "factor": self.factor,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config

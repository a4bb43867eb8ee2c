import keras
from keras import ops

from elita_tf.layers.checks import as_sequence, check_sequence_call, take_arguments_as_given
from elita_tf.ops.utils.nonfinite import contain_nonfinite
from elita_tf.renames import accepts_renamed_arguments


class CausalMixer(keras.layers.Layer):
    """Base of the causal sequence layers: one place for input checks, masks and non-finite inputs.

    A subclass names its decoding cache's tensors in `cache_names`, returns
    them in that order from `initial_state(batch_size, dtype)`, and
    implements `mix(inputs, padding_mask, cache, training, document_starts)` on a
    checked float `[B, T, d]` input in its compute dtype, `cache` being the
    named dict or None, returning `outputs` or `(outputs, new_cache)`. The
    base:

    - gives callers the cache as a named dict of fixed-shape tensors
      (`get_initial_cache`), returned anew by every call, never mutated;

    - refuses inputs that are not a float `[B, T, d]` sequence, a padding
      mask that is not `[B, T]`, and a cache of other shapes or another batch
      size than `get_initial_cache` gives, with messages that name the value;
    - takes the padding mask from `padding_mask`, or else the Keras mask;
    - keeps a cache in its own dtype: Keras would cast every float argument
      to the compute dtype, so a float32 recurrent state would silently
      become float16 under mixed precision;
    - contains non-finite inputs (`contain_nonfinite`): a NaN or Inf at
      position `t` never changes an output before `t`, and a padded position
      never changes any output, whatever it holds. From `t` on, outputs are
      NaN: in the parallel form all of them; when decoding, as long as the
      state holds position `t` (for ever in a global state, until it leaves
      a window's ring buffer).

    Call arguments:
        inputs: float tensor `[B, T, d]`.
        padding_mask: optional bool `[B, T]`, False at padding. Defaults to
            the Keras mask.
        cache: optional dict from `get_initial_cache` or a previous call.
        document_starts: optional bool `[B, T]`, True where a new document starts:
            no position sees anything before the start of its own document
            (packed documents). Every mixer takes it without a cache, and a
            single decoding step with a reset starts again from
            `get_initial_cache`. Over several positions with a cache (a
            stream carried from call to call) only mixers with
            `document_starts_with_cache` (a constant-size state) take it.
        training: bool.

    Returns:
        `outputs [B, T, d]`, or `(outputs, new_cache)` when a cache is passed.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        take_arguments_as_given(self)

    def __call__(self, inputs, *args, **kwargs):
        return super().__call__(as_sequence(inputs), *args, **kwargs)

    #: The names of the decoding state's tensors, in the order of `initial_state` and `mix`.
    cache_names = ()
    #: Whether `mix` takes `document_starts` together with a state over several positions. Without a state every
    #: mixer takes them; a buffer of positions (a key/value cache) would have to forget its older documents.
    document_starts_with_cache = False

    @accepts_renamed_arguments
    def call(self, inputs, padding_mask=None, cache=None, training=None, mask=None, document_starts=None):
        inputs, padding_mask = check_sequence_call(self, inputs, mask if padding_mask is None else padding_mask, cache)
        cache = None if cache is None else {name: cache[name] for name in self.cache_names}
        if document_starts is not None:
            document_starts = self._check_document_starts(inputs, document_starts, cache)
        if cache is not None and inputs.shape[1] == 1:
            if document_starts is not None:  # a step that starts a document starts from the empty cache
                dtype = cache[self.cache_names[0]].dtype
                empty = self.get_initial_cache(ops.shape(inputs)[0], dtype)
                cache = {
                    name: _select_rows(document_starts[:, 0], empty[name], cache[name]) for name in self.cache_names
                }
                document_starts = None
            # One decoding step has no earlier row to protect, and a non-finite input makes the
            # cache non-finite by itself; padded steps are selected out by the step ops.
            return self.mix(inputs, padding_mask, cache, training, document_starts)
        return contain_nonfinite(
            lambda x: self.mix(x, padding_mask, cache, training, document_starts), inputs, padding_mask
        )

    def _check_document_starts(self, inputs, document_starts, cache):
        if cache is not None and inputs.shape[1] != 1 and not self.document_starts_with_cache:
            raise ValueError(
                f"{type(self).__name__} '{self.name}' cannot take `document_starts` with a cache over several "
                "positions: "
                "only the mixers with a constant-size state (Attention2, LinearAttention, AdditiveAttention) "
                "restart inside a carried stream. Without a cache every mixer takes them (packed documents). "
                f"Received: inputs with shape {inputs.shape}, document_starts={document_starts!r}"
            )
        document_starts = ops.convert_to_tensor(document_starts)
        dtype = keras.backend.standardize_dtype(document_starts.dtype)
        if dtype != "bool" or len(document_starts.shape) != 2:
            raise ValueError(
                "`document_starts` must be a bool tensor [B, T]. "
                f"Received: document_starts with dtype {dtype} "
                f"and shape {tuple(document_starts.shape)}"
            )
        for axis, (got, want) in enumerate(zip(document_starts.shape, inputs.shape[:2])):
            if got is not None and want is not None and got != want:
                raise ValueError(
                    f"`document_starts` must have the inputs' [B, T] = {list(inputs.shape[:2])}. "
                    f"Received: document_starts with shape {tuple(document_starts.shape)}"
                )
        return document_starts

    def get_initial_cache(self, batch_size, dtype=None):
        """The decoding cache before any position: `{name: tensor}`, batch first, in fixed shapes.

        Args:
            batch_size: int or scalar tensor.
            dtype: optional float dtype of the accumulators. Defaults to the
                layer's (float32 under mixed precision).
        """
        return dict(zip(self.cache_names, self.initial_state(batch_size, dtype)))

    def initial_state(self, batch_size, dtype=None):
        raise NotImplementedError(f"{type(self).__name__} must implement `initial_state`.")

    def mix(self, inputs, padding_mask, cache, training, document_starts=None):
        raise NotImplementedError(f"{type(self).__name__} must implement `mix`.")

    def compute_mask(self, inputs, mask=None):
        return mask

    def compute_output_shape(self, inputs_shape):
        return inputs_shape


def _select_rows(rows, where_true, where_false):
    """`where_true` in the rows (batch axis 0) where `rows [B]` holds, else `where_false`."""
    shape = (*ops.shape(rows), *[1] * (len(where_false.shape) - 1))
    return ops.where(ops.reshape(rows, shape), ops.cast(where_true, where_false.dtype), where_false)

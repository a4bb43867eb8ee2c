"""Dtypes: where accumulations happen, and the finite stand-ins for log(0)."""

import keras

# A finite stand-in for log(0): exp() of it is exactly 0, and unlike -inf it
# never makes `-inf - -inf = nan` in a forward or backward pass.
NEG_INF = -1e30

# The logit of a key a row must not see: far below a masked key's NEG_INF, so that a row that sees
# only masked keys (normaliser NEG_INF, so `l_j - L_i` about -NEG_INF) still gives it no weight.
# Finite in float32.
UNSEEN_LOGIT = 1e8 * NEG_INF


def accumulator_dtype(dtype):
    """float64 stays float64, anything else is accumulated in float32 (a dtype name)."""
    return "float64" if keras.backend.standardize_dtype(dtype) == "float64" else "float32"


def dtype_of(x):
    """`x`'s dtype as Keras names it (`"float32"`, `"bool"`, ...), on every backend."""
    return keras.backend.standardize_dtype(x.dtype)


def is_float(x):
    return "float" in dtype_of(x)

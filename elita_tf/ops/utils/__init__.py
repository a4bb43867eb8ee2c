"""Primitives the ops and layers share, one idea a module.

dtypes       accumulator dtypes and `NEG_INF`
positions    padding an axis, writing positions into buffers, where real positions end
nonfinite    `contain_nonfinite`: a NaN input never reaches an earlier output; `nan_rows`
token_ids    token ids and labels in `[0, V)`: an error where their values are known, else NaN downstream
documents    packed documents: restarting positions and gated scans

What `keras.ops` lacks, one module a backend, is `elita_tf.backend`.
"""

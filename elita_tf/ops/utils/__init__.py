"""Primitives the ops and layers share, one idea a module.

dtypes       accumulator dtypes and `NEG_INF`
positions    padding an axis, writing positions into buffers, where real positions end
xla          `branch_or_select`: a branch on a CPU, a select under XLA or on a GPU
nonfinite    `contain_nonfinite`: a NaN input never reaches an earlier output
documents    packed documents: restarting positions and gated scans
"""

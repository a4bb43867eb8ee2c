"""The layers' named options, without TensorFlow: command lines and architectures check them before a layer loads."""

# The sequence length every layer and the backbone take unless given: the positions a decoding buffer
# holds, Attention2's `position_scale` and a run's training length.
DEFAULT_SEQUENCE_LENGTH = 256
# Attention2's positions: the sinusoids run on past `position_scale` ("fixed"), hold the last trained
# position ("clamped"), or move with the sequence length ("length", the original's; it cannot decode).
POSITION_MODES = ("fixed", "clamped", "length")
# DecoderBlock's norms (or None: the identity) and residual forms.
NORMS = ("layer_norm", "unscaled_layer_norm", "rms_norm", "rms_norm_outer_epsilon")
RESIDUALS = ("pre_norm", "parallel", "sequential")

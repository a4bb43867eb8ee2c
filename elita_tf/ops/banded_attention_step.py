"""The decoding form of `banded_attention`: one position at a time from a fixed-size state.

With a window the state is a ring buffer: slot 0 the start position, slots `1 .. window - 1` the
last `window - 1` positions; without, one slot a position up to `max_sequence_length`. Each step
equals the last row of `banded_attention` over all positions so far.
"""

from keras import ops

from elita_tf import backend
from elita_tf.ops.banded_attention import check_window, dense_attention, prepare_inputs
from elita_tf.ops.utils.nonfinite import nan_rows
from elita_tf.ops.utils.positions import write_positions


def banded_attention_step(state, query, key, value, window=None, slope=0.0, hyper=0.0, scale=None, mask=None):
    """One decoding step of `banded_attention`.

    Args:
        state: from `empty_banded_state()`, `banded_attention` or a previous step.
        query: float `[B, H, Dk]`, the new position's query.
        key: float `[B, H, Dk]`.
        value: float `[B, H, Dv]`.
        window, slope, hyper, scale: as in `banded_attention`; must match the state.
        mask: optional bool `[B]`; False makes the new position no key of later rows.

    Returns:
        `(out [B, H, Dv], new_state)`, equal to the last row of
        `banded_attention` over all positions so far. Costs O(window) with a
        window, O(max_sequence_length) without.
    """
    check_window(window)
    query, key, value, valid, scale = prepare_inputs(
        query[:, :, None], key[:, :, None], value[:, :, None], None if mask is None else mask[:, None], scale
    )
    keys, values, slot_valid, index = state
    keys, values = ops.cast(keys, key.dtype), ops.cast(values, value.dtype)
    batch = ops.shape(keys)[0]
    if window is None:
        # index < slots: the new position fits.
        backend.check_less_equal(ops.max(index) + 1, ops.shape(keys)[2], "The state holds fewer positions than needed")
        keys = write_positions(keys, key, index, axis=2)
        values = write_positions(values, value, index, axis=2)
        slot_valid = write_positions(slot_valid, valid, index, axis=1)
        values = nan_rows(index + 1 > ops.shape(keys)[2], values)  # where no check runs: NaN, not a guess
        slots = ops.shape(keys)[2]
        key_pos = ops.broadcast_to(ops.arange(slots, dtype="int32")[None, :], (batch, slots))
        out = dense_attention(query, keys, values, slot_valid, index[:, None], key_pos, None, slope, hyper, scale)
        return out[:, :, 0], (keys, values, slot_valid, index + 1)

    # Slot 0 is position 0; slot s >= 1 is position index - window + s. Ring
    # slots at positions <= 0 are empty or repeat the start position.
    key_pos = ops.concatenate(
        [ops.zeros((batch, 1), "int32"), index[:, None] - window + ops.arange(1, window, dtype="int32")[None, :]], 1
    )
    first_slot = ops.equal(ops.arange(window, dtype="int32"), 0)[None, :]
    key_valid = ops.logical_and(slot_valid, ops.logical_or(key_pos >= 1, first_slot))
    out = dense_attention(query, keys, values, key_valid, index[:, None], key_pos, window, slope, hyper, scale)
    fresh = ops.equal(index, 0)
    fresh_keys = fresh[:, None, None, None]
    new_state = (
        ops.concatenate([ops.where(fresh_keys, key, keys[:, :, :1]), keys[:, :, 2:], key], axis=2),
        ops.concatenate([ops.where(fresh_keys, value, values[:, :, :1]), values[:, :, 2:], value], axis=2),
        ops.concatenate([ops.where(fresh[:, None], valid, slot_valid[:, :1]), slot_valid[:, 2:], valid], axis=1),
        index + 1,
    )
    return out[:, :, 0], new_state

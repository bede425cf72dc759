"""Block payloads on MLX: one layer of a block's keys and values, and views of them.

A payload holds the keys and values of the block's positions ``start .. n_tokens - 1``,
shaped ``(1, kv_heads, n_tokens - start, head_dim)`` (``kv_arrays``): a ``StackedKV`` when
they were read from disk, or cut from a finished sequence into the restore buffers, an
``MlxKV`` otherwise. A ``StackedKV`` lies in a buffer that is reused once the payload is
gone (``restore_buffers``), so nothing built from blocks may keep their memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from semantic.domain.errors import IncompatibleCacheError

ALL = slice(None)
HOST_DTYPES = {mx.float32: np.float32}
"""KV dtypes the host pass reads in place."""


@dataclass(frozen=True, slots=True)
class MlxKV:
    """One layer of a block as arrays of its own: cut from a cache that could not be
    stacked (see ``kv_blocks.cut_into_blocks``), or decoded from a quantized file."""

    keys: mx.array
    values: mx.array
    owner: object | None = None
    """What must stay alive while these tensors do (a restore buffer's lease)."""


@dataclass(frozen=True, slots=True)
class StackedKV:
    """One layer of a block: where its keys and values lie in the buffer that holds all
    the block's tensors back to back, alike in shape, as its file does (the buffer its file
    was read into, or the one a finished sequence was cut into).

    The arrays are views made by whoever uses them, on their own thread, when they do: made
    on the reader thread they would be lazy ops of that thread's stream, which no other
    thread can run, and evaluating them there cost each file a round trip through MLX's
    scheduler while both cores were busy reading (~0.5 ms a file, a sixth of a restore).
    """

    buffer: mx.array
    dtype: mx.Dtype
    stack_shape: tuple[int, ...]
    """(tensors in the file, kv_heads, positions, head_dim)"""
    keys_at: int
    values_at: int
    owner: object | None = None
    """The buffer's lease: it goes back to the restore buffers when this goes."""

    def arrays(
        self, positions: slice, stacks: dict[int, mx.array] | None = None
    ) -> tuple[mx.array, mx.array]:
        """Views of the keys and values at ``positions``; ``stacks`` shares one view of
        each buffer among the layers of one gather."""
        stack = stacks.get(id(self.buffer)) if stacks is not None else None
        if stack is None:
            stack = self.buffer.view(self.dtype).reshape(self.stack_shape)
            if stacks is not None:
                stacks[id(self.buffer)] = stack
        keys, values = self.keys_at, self.values_at  # slices: an integer index is a gather
        return (
            stack[keys : keys + 1, :, positions, :],
            stack[values : values + 1, :, positions, :],
        )


def kv_arrays(
    payload: object, positions: slice = ALL, stacks: dict[int, mx.array] | None = None
) -> tuple[mx.array, mx.array]:
    """A block payload's keys and values at ``positions``, whichever way it holds them."""
    if isinstance(payload, MlxKV):
        if positions == ALL:
            return payload.keys, payload.values
        return payload.keys[..., positions, :], payload.values[..., positions, :]
    if isinstance(payload, StackedKV):
        return payload.arrays(positions, stacks)
    raise IncompatibleCacheError(f"block payload is {type(payload).__name__}, not MLX KV")


def host_rows(
    payload: object, positions: slice, buffers: dict[int, np.ndarray]
) -> tuple[np.ndarray, np.ndarray] | None:
    """A payload's keys and values at ``positions`` as numpy views ``(kv_heads, n, dim)`` of
    the memory they lie in: no copy and no MLX op. ``buffers`` shares each restore buffer's
    view among the layers. None for a payload held some other way (a decoded quantized
    block, say)."""
    if isinstance(payload, StackedKV):
        stack = buffers.get(id(payload.buffer))
        if stack is None:
            host_dtype = HOST_DTYPES.get(payload.dtype)
            if host_dtype is None:
                return None
            stack = np.asarray(payload.buffer).view(host_dtype).reshape(payload.stack_shape)
            buffers[id(payload.buffer)] = stack
        return stack[payload.keys_at, :, positions], stack[payload.values_at, :, positions]
    if isinstance(payload, MlxKV) and payload.keys.dtype in HOST_DTYPES:
        keys, values = np.asarray(payload.keys), np.asarray(payload.values)
        return keys[0, :, positions], values[0, :, positions]
    return None

"""A group's KV cache buffers as ``native/llama_pass.c`` reads them: a pointer a layer and
one set of strides, remembered while the caches hold the same arrays (``HostPass``)."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

_Pointer = ctypes.c_void_p


@dataclass(frozen=True, slots=True)
class BufferLayout:
    """Kept while its caches hold the same arrays, a decode step skips two conversions a
    buffer (60 layers' buffers took ~0.9 ms a step on the Zen 3 VM of ADR 0013). The arrays
    are held weakly: a layout never keeps a finished batch's KV in memory, and an array it
    saw cannot be mistaken for a new one at the same address."""

    keys: tuple[weakref.ref[mx.array], ...]
    values: tuple[weakref.ref[mx.array], ...]
    capacity: int
    key_pointers: Any
    value_pointers: Any
    k_strides: tuple[int, int, int]
    v_strides: tuple[int, int, int]

    @classmethod
    def of(cls, caches: Sequence[Any]) -> BufferLayout:
        """Every layer's buffers, evaluated, laid out alike (the C side takes layer 0's
        strides for all)."""
        keys = [np.asarray(c.keys) for c in caches]
        values = [np.asarray(c.values) for c in caches]
        if any(k.strides != keys[0].strides for k in keys) or any(
            v.strides != values[0].strides for v in values
        ):
            raise ValueError("the layers' cache buffers are laid out differently")
        return cls(
            tuple(weakref.ref(c.keys) for c in caches),
            tuple(weakref.ref(c.values) for c in caches),
            caches[0].keys.shape[2],
            (_Pointer * len(keys))(*(k.ctypes.data for k in keys)),
            (_Pointer * len(values))(*(v.ctypes.data for v in values)),
            _float_strides(keys[0]),
            _float_strides(values[0]),
        )

    def holds(self, caches: Sequence[Any]) -> bool:
        if len(caches) != len(self.keys):
            return False
        return all(
            _same(c.keys, k) and _same(c.values, v)
            for c, k, v in zip(caches, self.keys, self.values, strict=True)
        )


def _same(array: mx.array | None, seen: weakref.ref[mx.array]) -> bool:
    held = seen()
    return held is not None and array is held


def _float_strides(array: np.ndarray) -> tuple[int, int, int]:
    b, h, p, _ = (s // 4 for s in array.strides)
    return b, h, p

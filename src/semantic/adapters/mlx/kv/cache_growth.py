"""A decode batch's cache buffers grown a few layers a step ahead of need.

Every layer's buffers grow together when they are full (the host pass wants one layout for
all layers): a new, bigger buffer for each, with everything so far copied in. Done in one
step, that is the whole batch's KV copied into fresh memory at once: four streams stalled
165-290 ms every 256 tokens here, and the stall grows with the batch and its context. So
once a batch has ``LEAD`` positions of room left, each step makes the bigger buffers of a
few layers and copies in what they hold; when all are made, the few positions written since
are copied too and every layer switches in the same step. The stall is spread over
``LEAD / 2`` steps (a layer each for this model), where a round's prefill slice makes up
for it (ADR 0009, ADR 0013).

Past 2,048 positions a growth adds a quarter of the capacity (whole steps) instead of one
step, so a long decode copies and faults in its KV a bounded number of times rather than
once every 256 tokens: a new buffer's first touch costs a page fault per 4 KiB (~2 us on
the Firecracker VMs here: 3 ms for a fresh 6.3 MB buffer against 0.24 ms for one reused
from MLX's cache), which made up most of a growth's cost. Eight streams decoding 520
tokens past 2,440-token prompts spent 792 ms growing with steps of 256 and 253 ms with a
quarter (in one process; AMD EPYC Zen 5 VM). At most a quarter of a batch's buffers is
room not yet written.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.lm import BatchKVCache

LEAD = 64
"""Positions of room left when the next buffers start to be made."""


@dataclass
class _Made:
    keys: mx.array
    values: mx.array
    copied: int
    """Positions copied from the old buffers so far."""


@dataclass
class _Growing:
    """The bigger buffers made so far for one batch's caches, and the old buffers' addresses
    they copy from (a batch that changed since has other buffers: this is then dropped).
    The caches themselves are held weakly: a batch dropped mid-way and a new one whose
    buffers MLX's allocator then placed at the same addresses must not match (the copies
    made hold the old batch's KV)."""

    sources: list[tuple[int, int]]
    owners: list[weakref.ref[Any]]
    width: int
    made: list[_Made] = field(default_factory=list)

    def matches(self, caches: list[Any]) -> bool:
        if len(caches) != len(self.sources):
            return False
        same = all(owner() is cache for owner, cache in zip(self.owners, caches, strict=True))
        return same and _addresses(caches) == self.sources


class GrowAhead:
    """Grows one decode batch's caches ahead of need (one batch at a time: the engine has
    one)."""

    def __init__(self, step: int, lead: int = LEAD) -> None:
        self._step = step
        self._lead = lead
        self._growing: _Growing | None = None

    def extra(self, capacity: int) -> int:
        """Positions a growth adds: a step, or a quarter of a long capacity in whole steps."""
        return max(self._step, capacity // 4 // self._step * self._step)

    def before_step(self, caches: list[Any], write_at: int, length: int) -> None:
        """Make the next layers' bigger buffers, or switch to them all once made. Only a
        batch's one-token steps (a decode step) with every layer laid out alike."""
        if length != 1 or not _plain_batch(caches):
            return
        growing = self._growing
        if growing is not None and not growing.matches(caches):
            growing = self._growing = None
        capacity = caches[0].keys.shape[2]
        if growing is None:
            if capacity - write_at > self._lead:
                return
            owners = [weakref.ref(cache) for cache in caches]
            width = capacity + self.extra(capacity)
            growing = self._growing = _Growing(_addresses(caches), owners, width)
        per_step = math.ceil(len(caches) / max(1, self._lead // 2))
        for cache in caches[len(growing.made) : len(growing.made) + per_step]:
            growing.made.append(_made(cache, growing.width, write_at))
        if len(growing.made) == len(caches):
            for cache, made in zip(caches, growing.made, strict=True):
                _copy(cache.keys, made.keys, made.copied, write_at)
                _copy(cache.values, made.values, made.copied, write_at)
                cache.keys, cache.values = made.keys, made.values
            self._growing = None


def alike(caches: list[Any]) -> bool:
    """Every layer's buffers of one shape (the host pass takes layer 0's layout for all)."""
    first = caches[0]
    return all(
        c.keys.shape == first.keys.shape and c.values.shape == first.values.shape for c in caches
    )


def _plain_batch(caches: list[Any]) -> bool:
    if not caches or any(type(c) is not BatchKVCache or c.keys is None for c in caches):
        return False
    return alike(caches)


def _addresses(caches: list[Any]) -> list[tuple[int, int]]:
    return [(_address(c.keys), _address(c.values)) for c in caches]


def _address(array: mx.array) -> int:
    return int(np.asarray(array).ctypes.data)


def _made(cache: Any, width: int, write_at: int) -> _Made:
    """A layer's bigger buffers (zeros past what is copied), holding its first ``write_at``
    positions; nothing else holds them, so they are filled in place."""
    keys, values = (_zeros_like(a, width) for a in (cache.keys, cache.values))
    _copy(cache.keys, keys, 0, write_at)
    _copy(cache.values, values, 0, write_at)
    return _Made(keys, values, write_at)


def _zeros_like(array: mx.array, width: int) -> mx.array:
    batch, heads, _, dim = array.shape
    out = mx.zeros((batch, heads, width, dim), array.dtype)
    mx.eval(out)
    return out


def _copy(source: mx.array, target: mx.array, start: int, stop: int) -> None:
    if stop > start:
        np.asarray(target)[:, :, start:stop] = np.asarray(source)[:, :, start:stop]

"""Small forward passes (decode steps, rides, short chunks) on the host, in one C call.

A pass of up to 32 rows spends most of its time outside the weight products when MLX runs
it: ~25 small ops a layer, each a hop to MLX's stream thread, and MLX's scalar ``exp`` in
SwiGLU and RoPE. ``native/llama_pass.c`` runs the whole body of a llama-bodied model
(llama, Llama 3, Mistral, Qwen2, Qwen3: ``model_parts``) for such a pass: the products
through our batch-invariant kernel, the rest as vector loops, the new keys and values
written straight into the caches' buffers (mlx-lm's ``KVCache`` and ``BatchKVCache``,
whose bookkeeping this module advances as their own update would).
Bigger passes stay on MLX. ADR 0013 has the measurements.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from semantic.adapters.mlx.accelerator import Group
from semantic.adapters.mlx.cpu import host_model
from semantic.adapters.mlx.cpu.buffer_layout import BufferLayout
from semantic.adapters.mlx.cpu.fused_pass import MAX_ROWS
from semantic.adapters.mlx.cpu.host_model import HostModel
from semantic.adapters.mlx.cpu.llama_native import (
    HOST_PASS_ENV,
    native_library,
    small_kernels_loaded,
    wanted,
)
from semantic.adapters.mlx.kv.cache_growth import LEAD, GrowAhead, alike
from semantic.adapters.mlx.kv.restored_prefix import RestoredPrefix
from semantic.adapters.mlx.lm import BatchKVCache, KVCache

NAME = "llama-host-pass-v4"
"""Goes into the model fingerprint: KV computed by this pass rounds differently. v3: one
kernel source for every variant (ADR 0026), its scalar tails fused; the same bits on
AVX-512, AVX2 and NEON. v4: where it runs, prompt chunks on MLX's graph take its SwiGLU
too (``host_swiglu``)."""

_CACHE_STEP = 256
"""Cache buffers grow in mlx-lm's steps, so its own updates find the same shapes."""

_LAYOUTS_KEPT = MAX_ROWS + 2
"""A pass's groups at most: a batch, a ride, and a row per group of its own (a decode
step's constrained rows, ``DecodeBatch``); one not found costs ~0.9 ms to lay out again."""

_Pointer = ctypes.c_void_p


class _Group(ctypes.Structure):
    _fields_ = [
        ("batch", ctypes.c_int),
        ("length", ctypes.c_int),
        ("write_at", ctypes.c_int),
        ("lo", _Pointer),
        ("pos", _Pointer),
        ("keys", _Pointer),
        ("values", _Pointer),
        ("k_strides", ctypes.c_long * 3),
        ("v_strides", ctypes.c_long * 3),
        ("prefix", ctypes.c_int),
        ("n_segments", ctypes.c_int),
        ("segments", _Pointer),
    ]


def supported(model: Any) -> bool:
    """Whether ``HostPass.of(model)`` would run this model's small passes on the host."""
    return obstacle(model) is None


def obstacle(model: Any) -> str | None:
    """Why this model's small passes cannot run on the host; None when they can."""
    if not wanted():
        return f"{HOST_PASS_ENV}=0"
    if not small_kernels_loaded():
        return "our matmul kernels are not in front of the BLAS (their own line says why)"
    if _pass_function() is None:
        return "native/llama_pass.c did not build (no C compiler?)"
    return host_model.obstacle(model)


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where one group's new rows go: the same for all its layers' caches (``layout``: their
    buffers as a step before described them, if they are the same arrays and have room)."""

    write_at: int
    lo: np.ndarray
    pos: np.ndarray
    layout: BufferLayout | None = None


class HostPass:
    """The body of one llama-bodied model, ready to run a small pass on the host."""

    def __init__(self, weights: HostModel, function: Any, grow_lead: int = LEAD) -> None:
        self._function = function
        self._weights = weights
        self._embed = weights.embed
        self._kv_heads, self._head_dim, self._hidden = (
            weights.kv_heads,
            weights.head_dim,
            weights.hidden,
        )
        self._growth = GrowAhead(_CACHE_STEP, grow_lead)
        self._layouts: list[BufferLayout] = []
        """The last groups' (a decode batch's, a ride's, each constrained row's own)."""

    @classmethod
    def of(cls, model: Any, grow_lead: int = LEAD) -> HostPass | None:
        """None unless the model is a float32 llama-bodied one with our attention, where
        our kernels built (and ``SEMANTIC_HOST_PASS`` is not ``0``). ``grow_lead``: see
        ``cache_growth.LEAD``."""
        if not wanted():
            return None
        function = _pass_function()
        weights = HostModel.of(model) if function is not None else None
        if weights is None:
            return None
        return cls(weights, function, grow_lead)

    def hidden(self, groups: Sequence[Group]) -> list[mx.array] | None:
        """Each group's final hidden states ``(batch, length, dim)``, after the model's
        last norm, with the groups' caches advanced; None (nothing done) when the pass is
        too big or a cache is not one this pass writes. One group reading a restored
        prefix in place runs in passes of ``MAX_ROWS``, however long: the backend admits
        such a group only for a few passes' worth of rows (``restored_caches.IN_PLACE_PASSES``)."""
        if len(groups) == 1 and groups[0].prefix is not None:
            return self._in_passes(groups[0])
        pass_ = self.prepare(groups)
        if pass_ is None:
            return None
        pass_.run()
        return pass_.finish()

    def _in_passes(self, group: Group) -> list[mx.array] | None:
        """Each pass reads the prefix where it lies and the rows the passes before it
        wrote into the group's own caches. What the first pass's checks found (one row,
        plain caches, now grown to be written here) holds for the rest."""
        length = group.tokens.shape[1]
        parts = [group.tokens[:, start : start + MAX_ROWS] for start in range(0, length, MAX_ROWS)]
        hidden = []
        for index, tokens in enumerate(parts):
            pass_ = self.prepare([Group(tokens, group.caches, group.prefix)])
            if pass_ is None:
                if index:  # the checks passed for the first: they hold for the rest
                    raise RuntimeError("a host pass refused the rest of a prefixed group")
                return None
            pass_.run()
            hidden.extend(pass_.finish())
        return [hidden[0] if len(hidden) == 1 else mx.concatenate(hidden, axis=1)]

    def prepare(self, groups: Sequence[Group]) -> PreparedPass | None:
        """Everything a pass needs from MLX, done on this thread: ``run`` then touches no
        MLX object, so another thread may run it while this one goes on with MLX work on
        other arrays."""
        rows = sum(g.tokens.shape[0] * g.tokens.shape[1] for g in groups)
        if rows > MAX_ROWS or not all(_plain_caches(g.caches) for g in groups):
            return None
        if any(g.prefix is not None and g.tokens.shape[0] != 1 for g in groups):
            return None
        mx.eval([g.tokens for g in groups])
        tokens = [np.asarray(g.tokens).astype(np.int64).reshape(-1) for g in groups]
        x = np.ascontiguousarray(self._embed(np.concatenate(tokens)), dtype=np.float32)
        plans = [self._make_room(g) for g in groups]
        described = [self._describe(g, plan) for g, plan in zip(groups, plans, strict=True)]
        structs = (_Group * len(groups))(*(d[0] for d in described))
        call = functools.partial(
            self._function, ctypes.byref(self._weights.struct), len(groups), structs, rows
        )
        return PreparedPass(call, x, list(groups), self._hidden, [structs, described])

    def _make_room(self, group: Group) -> _Plan:
        """Room for the group's new rows in every layer's buffers, as writable memory."""
        batch, length = group.tokens.shape
        first = group.caches[0]
        if type(first) is KVCache:
            write_at = first.offset
            position = write_at + (group.prefix.n_tokens if group.prefix is not None else 0)
            lo, pos = np.zeros(batch, np.int32), np.full(batch, position, np.int32)
        else:
            write_at = first._idx  # noqa: SLF001 - BatchKVCache keeps its write index here
            self._growth.before_step(group.caches, write_at, length)
            lo = np.ascontiguousarray(np.asarray(first.left_padding, np.int32).reshape(batch))
            pos = np.ascontiguousarray(np.asarray(first.offset, np.int32).reshape(batch))
        layout = next((s for s in self._layouts if s.holds(group.caches)), None)
        if layout is not None and layout.capacity >= write_at + length:
            return _Plan(write_at, lo, pos, layout)  # checked, grown and evaluated before
        if not all(_has_room(c, write_at + length) for c in group.caches) or not alike(
            group.caches
        ):  # every layer gets a buffer of one shape: the C side takes layer 0's strides
            for cache in group.caches:
                cache.keys, cache.values = self._grown(cache, batch, write_at, length)
        mx.eval([(c.keys, c.values) for c in group.caches])
        return _Plan(write_at, lo, pos)

    def _grown(
        self, cache: Any, batch: int, write_at: int, length: int
    ) -> tuple[mx.array, mx.array]:
        extra = -(-length // _CACHE_STEP) * _CACHE_STEP
        shape = (batch, self._kv_heads, extra, self._head_dim)
        if cache.keys is None:
            return mx.zeros(shape, mx.float32), mx.zeros(shape, mx.float32)
        keys = mx.concatenate([cache.keys[..., :write_at, :], mx.zeros(shape, mx.float32)], 2)
        values = mx.concatenate([cache.values[..., :write_at, :], mx.zeros(shape, mx.float32)], 2)
        return keys, values

    def _describe(self, group: Group, plan: _Plan) -> tuple[_Group, list[Any]]:
        batch, length = group.tokens.shape
        layout = plan.layout or self._laid_out(group.caches)
        described = _Group(
            batch,
            length,
            plan.write_at,
            plan.lo.ctypes.data,
            plan.pos.ctypes.data,
            ctypes.cast(layout.key_pointers, _Pointer),
            ctypes.cast(layout.value_pointers, _Pointer),
            (ctypes.c_long * 3)(*layout.k_strides),
            (ctypes.c_long * 3)(*layout.v_strides),
            *_prefix_fields(group.prefix),
        )
        buffers = [(c.keys, c.values) for c in group.caches]  # written by the C pass
        return described, [layout, plan, buffers]

    def _laid_out(self, caches: list[Any]) -> BufferLayout:
        """The buffers' layout, remembered for the steps after."""
        layout = BufferLayout.of(caches)
        self._layouts = [*self._layouts[-(_LAYOUTS_KEPT - 1) :], layout]
        return layout


@dataclass(slots=True)
class PreparedPass:
    """A host pass between ``HostPass.prepare`` and ``finish``."""

    _call: Any
    _x: np.ndarray
    _groups: list[Group]
    _hidden: int
    _held: list[Any]
    """The pointer arrays and row plans the C side reads: they live through the call (the
    buffers themselves through ``_groups``' caches)."""
    _status: int | None = None

    def run(self) -> None:
        """The C pass (the GIL is released for it): the caches' buffers get the new keys
        and values, ``x`` becomes the final hidden states."""
        self._status = self._call(self._x.ctypes.data)

    def finish(self) -> list[mx.array]:
        """Each group's hidden states; the caches advanced as their own update would."""
        self._held.clear()
        if self._status is None:
            raise RuntimeError("a host pass was finished before it ran")
        if self._status != 0:
            raise MemoryError("the host pass could not allocate its scratch memory")
        out, start = [], 0
        for group in self._groups:
            batch, length = group.tokens.shape
            _advance(group.caches, length)
            part = self._x[start : start + batch * length].reshape(batch, length, self._hidden)
            out.append(mx.array(part))
            start += batch * length
        return out


def _prefix_fields(prefix: RestoredPrefix | None) -> tuple[int, int, int | None]:
    if prefix is None:
        return 0, 0, None
    return prefix.n_tokens, prefix.n_segments, ctypes.addressof(prefix.tables)


def _plain_caches(caches: list[Any]) -> bool:
    kinds = {type(c) for c in caches}
    if kinds not in ({KVCache}, {BatchKVCache}):
        return False
    return all(c.keys is None or c.keys.dtype == mx.float32 for c in caches)


def _has_room(cache: Any, needed: int) -> bool:
    """Room, and buffers we may write: plain strided memory with contiguous rows that
    nothing else owns past the cache's own positions (a view cut from a batch ends at its
    last position, so it never has room)."""
    if cache.keys is None or cache.keys.shape[2] < needed:
        return False
    return all(_rows_contiguous(a) for a in (cache.keys, cache.values))


def _rows_contiguous(array: mx.array) -> bool:
    strides = np.asarray(array).strides
    return strides[3] == 4 and strides[2] == 4 * array.shape[3] and min(strides) > 0


def _advance(caches: list[Any], length: int) -> None:
    """What the caches' own ``update_and_fetch`` would have counted. A batch's layers
    share one offsets array a step (the same values in every layer), made from layer 0's,
    already evaluated. Left lazy, ``offset + length`` grew a chain of additions a step in
    every layer no step reads, evaluated only when a row left (6.7 ms a layer after a
    thousand steps); thirty arrays of their own took 0.14-0.26 ms of a one-stream step
    (several times their cost in a loop: the pass has just flushed the CPU's caches).
    Sharing holds while no one moves a batch's offsets in place (MLX's ``+=`` writes into
    the array): mlx-lm's batch cache replaces them (``self.offset = self.offset + n``),
    and a test holds it to that."""
    if type(caches[0]) is KVCache:
        for cache in caches:
            cache.offset += length
        return
    moved = mx.array(np.asarray(caches[0].offset) + length)
    for cache in caches:
        cache._idx += length  # noqa: SLF001 - BatchKVCache's write index
        cache.offset = moved


@functools.cache
def _pass_function() -> Any:
    """``semantic_llama_pass``; None where the library is not loaded."""
    native = native_library()
    if native is None:
        return None
    function = native.semantic_llama_pass
    function.argtypes = [_Pointer, ctypes.c_int, _Pointer, ctypes.c_int, _Pointer]
    function.restype = ctypes.c_int
    return function

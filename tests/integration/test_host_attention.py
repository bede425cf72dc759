"""Attention's host half (native/softmax_pv.c, numpy where it cannot be built) against a
float64 reference, for every mask form mlx-lm passes, and its per-row bit stability."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from semantic.adapters.mlx.cpu import attention
from semantic.adapters.mlx.cpu.attention import PendingAttention

import mlx.core as mx  # isort: skip
import numpy as np  # isort: skip

HEADS, KV_HEADS, DIM = 9, 3, 64


def _random(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _attend(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: Any) -> np.ndarray:
    pending = PendingAttention.start(mx.array(q), mx.array(k), mx.array(v), 0.125, mask)
    mx.eval(pending.needed)
    batch, _, length, _ = q.shape
    out = np.asarray(pending.finish()).reshape(batch, length, HEADS, DIM)
    return out.transpose(0, 2, 1, 3)


def _reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """``keep``: (batch, length, span) booleans."""
    group = HEADS // KV_HEADS
    k64, v64 = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    scores = q.astype(np.float64) @ k64.swapaxes(-1, -2) * 0.125
    scores = np.where(keep[:, None], scores, -np.inf)
    peak = scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores - np.where(np.isinf(peak), 0, peak))
    total = weights.sum(axis=-1, keepdims=True)
    return (weights / np.where(total == 0, 1, total)) @ v64


def test_the_kernel_is_built_wherever_there_is_a_compiler() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here")
    assert attention.kernel_name() == "host-softmax-pv-v2"


@pytest.mark.parametrize(("length", "span"), [(1, 1), (1, 4000), (8, 4000), (28, 300), (5, 37)])
def test_a_causal_chunk_matches_the_reference(length: int, span: int) -> None:
    q = _random(1, HEADS, length, DIM, seed=1)
    k, v = _random(1, KV_HEADS, span, DIM, seed=2), _random(1, KV_HEADS, span, DIM, seed=3)
    keep = np.arange(span)[None, :] <= (span - length + np.arange(length))[:, None]
    mask = "causal" if length > 1 else None
    np.testing.assert_allclose(_attend(q, k, v, mask), _reference(q, k, v, keep[None]), atol=2e-5)


def test_left_padded_rows_match_the_reference_and_empty_rows_are_zero() -> None:
    batch, length, span = 3, 4, 50
    q = _random(batch, HEADS, length, DIM, seed=4)
    k, v = _random(batch, KV_HEADS, span, DIM, seed=5), _random(batch, KV_HEADS, span, DIM, seed=6)
    padding = np.array([0, 7, span])  # the last sequence is all padding: it attends nothing
    positions = span - length + np.arange(length)
    keep = (np.arange(span)[None, None, :] >= padding[:, None, None]) & (
        np.arange(span)[None, None, :] <= positions[None, :, None]
    )
    got = _attend(q, k, v, mx.array(keep[:, None]))
    np.testing.assert_allclose(got, _reference(q, k, v, keep), atol=2e-5)
    assert not np.any(got[2])


def test_a_row_gets_the_same_bits_alone_in_a_chunk_or_in_a_padded_batch() -> None:
    span = 700
    q = _random(1, HEADS, 6, DIM, seed=7)
    k, v = _random(1, KV_HEADS, span, DIM, seed=8), _random(1, KV_HEADS, span, DIM, seed=9)
    chunk = _attend(q, k, v, "causal")  # the last row sees every key
    alone = _attend(q[:, :, -1:], k, v, None)
    pad = 13  # the same sequence left-padded beside another in a batch
    padded_k = np.concatenate([np.zeros((1, KV_HEADS, pad, DIM), np.float32), k], axis=2)
    padded_v = np.concatenate([np.zeros((1, KV_HEADS, pad, DIM), np.float32), v], axis=2)
    other = _random(1, KV_HEADS, span + pad, DIM, seed=10)
    keep = np.ones((2, 1, 1, span + pad), dtype=bool)
    keep[0, ..., :pad] = False
    batched = _attend(
        np.concatenate([q[:, :, -1:], q[:, :, :1]]),
        np.concatenate([padded_k, other]),
        np.concatenate([padded_v, other]),
        mx.array(keep),
    )
    assert np.array_equal(alone[0, :, 0], chunk[0, :, -1])
    assert np.array_equal(alone[0, :, 0], batched[0, :, 0])


def test_a_row_gets_the_same_bits_whether_or_not_its_batch_is_shared_between_threads() -> None:
    """A short decode row alone is computed by one thread; sixteen of them at a longer
    span are shared with the helper thread (above any threshold for sharing)."""
    if attention.kernel_name() != "host-softmax-pv-v2":
        pytest.skip("no native attention kernel here: nothing is shared")
    span = 600
    q = _random(16, HEADS, 1, DIM, seed=11)
    k, v = _random(16, KV_HEADS, span, DIM, seed=12), _random(16, KV_HEADS, span, DIM, seed=13)
    together = _attend(q, k, v, None)
    for row in (0, 7, 15):
        short = 40  # the same row over its first 40 positions: a small, unshared call
        alone = _attend(q[row : row + 1], k[row : row + 1], v[row : row + 1], None)
        assert np.array_equal(alone[0], together[row])
        first = _attend(
            q[row : row + 1], k[row : row + 1, :, :short], v[row : row + 1, :, :short], None
        )
        keep = np.zeros((16, 1, 1, span), dtype=bool)
        keep[..., :short] = True
        masked = _attend(q, k, v, mx.array(keep))
        assert np.array_equal(first[0], masked[row])

"""The geometry of a model's KV cache, and what it costs in blocks and bytes."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.domain.errors import InvalidRequestError

BLOCK_TOKENS = 256
"""Tokens per KV block; ADR 0002 explains the choice."""

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True, slots=True)
class ModelCacheSpec:
    """Shape of one sequence's KV cache.

    ``layer_windows[i]`` is ``None`` for a global-attention layer and the window length
    (tokens) for a sliding-window layer. Sliding layers never need more blocks than their
    window can touch, which is why block counts are asked per layer.
    """

    n_layers: int
    n_kv_heads: int
    k_head_dim: int
    v_head_dim: int
    kv_dtype: str
    layer_windows: tuple[int | None, ...]
    block_tokens: int = BLOCK_TOKENS

    def __post_init__(self) -> None:
        if self.kv_dtype not in _DTYPE_BYTES:
            raise InvalidRequestError(f"unsupported KV dtype {self.kv_dtype!r}")
        if len(self.layer_windows) != self.n_layers:
            raise InvalidRequestError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers"
            )
        if min(self.n_layers, self.n_kv_heads, self.k_head_dim, self.v_head_dim) <= 0:
            raise InvalidRequestError("cache dimensions must be positive")
        if self.block_tokens <= 0:
            raise InvalidRequestError("block_tokens must be positive")
        if any(w is not None and w <= 0 for w in self.layer_windows):
            raise InvalidRequestError("sliding windows must be positive")

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.kv_dtype]

    @property
    def bytes_per_token_per_layer(self) -> int:
        return self.n_kv_heads * (self.k_head_dim + self.v_head_dim) * self.dtype_bytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token costs across all layers (46,080 for SmolLM2 in float32)."""
        return self.bytes_per_token_per_layer * self.n_layers

    @property
    def block_bytes(self) -> int:
        """Bytes of one block of one layer: the pool's unit of account."""
        return self.bytes_per_token_per_layer * self.block_tokens

    @property
    def has_sliding_layers(self) -> bool:
        return self.layer_windows.count(None) != self.n_layers

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer]

    def first_block_needed(self, layer: int, n_tokens: int) -> int:
        """Index of the first block a layer must keep to continue after ``n_tokens``.

        A global layer needs every block; a sliding layer only those its window reaches.
        """
        window = self.layer_windows[layer]
        if window is None or n_tokens <= window:
            return 0
        return (n_tokens - window) // self.block_tokens

    def blocks_for_layer(self, layer: int, n_tokens: int) -> int:
        """Blocks one layer holds for a sequence of ``n_tokens`` tokens."""
        if n_tokens <= 0:
            return 0
        last = (n_tokens - 1) // self.block_tokens
        return last - self.first_block_needed(layer, n_tokens) + 1

    def blocks_for_tokens(self, n_tokens: int) -> int:
        """Blocks, summed over layers, that a sequence of ``n_tokens`` holds. Asked for
        every running request each round: the global layers are counted at once."""
        if n_tokens <= 0:
            return 0
        global_layers = self.layer_windows.count(None)
        total = global_layers * ((n_tokens - 1) // self.block_tokens + 1)
        if global_layers == self.n_layers:
            return total
        sliding = (i for i, w in enumerate(self.layer_windows) if w is not None)
        return total + sum(self.blocks_for_layer(layer, n_tokens) for layer in sliding)

    def tokens_within(self, blocks: int, limit: int) -> int:
        """The longest sequence, at most ``limit`` tokens, whose KV fits in ``blocks``
        (sliding-window layers stop growing, so the answer need not be proportional)."""
        low, high = 0, limit
        while low < high:
            middle = (low + high + 1) // 2
            if self.blocks_for_tokens(middle) <= blocks:
                low = middle
            else:
                high = middle - 1
        return low

    def kv_bytes(self, n_tokens: int) -> int:
        """Bytes of real KV (no block rounding) a sequence of ``n_tokens`` holds."""
        total = 0
        for window in self.layer_windows:
            held = n_tokens if window is None else min(n_tokens, window)
            total += held * self.bytes_per_token_per_layer
        return total

"""A sequence's caches as it opens with what it restored.

Most sequences get their restored blocks gathered into buffers of their own at once. A
returning agent whose new tokens fit a few host passes skips that copy before its first
token: its passes read the blocks where they lie (a ``RestoredPrefix``), and the gather
happens only when a pass on MLX or the decode batch needs the KV in one piece.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.devices import HostMemory
from semantic.adapters.mlx.kv.kv_blocks import gather_cache
from semantic.adapters.mlx.kv.restored_prefix import RestoredPrefix
from semantic.adapters.mlx.lm import make_prompt_cache
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec

IN_PLACE_PASSES = 2
"""A returning agent's new tokens run in host passes reading its restored prefix in place
when they fit this many passes; more go through MLX after the prefix is gathered. Past two
passes MLX's larger products win at a 4K context (ADR 0013 has the sweep)."""


class RestoredCaches:
    def __init__(self, model: Any, spec: ModelCacheSpec, host: HostMemory, host_rows: int) -> None:
        """``host_rows``: the rows one host pass takes (0: no host pass, so every prefix is
        gathered); ``host``: whether numpy may view the KV where it lies (where not, blocks
        are gathered by MLX ops on the device's own stream)."""
        self._model = model
        self._spec = spec
        self._host = host
        self._host_rows = host_rows
        self._streams: tuple[Any, ...] | None = None

    def open(
        self, restored: AgentBlocks | None, n_restored: int, n_new: int
    ) -> tuple[list[Any], RestoredPrefix | None]:
        """The sequence's caches, and the prefix its host passes read in place (or None:
        the caches hold the restored KV already, with room for ``n_new`` more)."""
        prefix = self._in_place(restored, n_restored, n_new)
        if prefix is not None:
            return make_prompt_cache(self._model), prefix
        caches = gather_cache(
            self._model, restored, n_restored, n_new, self._spec, streams=self.streams()
        )
        return caches, None

    def gathered(self, prefix: RestoredPrefix, tails: list[Any]) -> list[Any]:
        """A prefix read in place until now, copied in front of the rows passes wrote since
        (``tails``): caches of their own."""
        blocks, n_tokens, streams = prefix.blocks, prefix.n_tokens, self.streams()
        return gather_cache(
            self._model, blocks, n_tokens, 0, self._spec, streams=streams, tails=tails
        )

    def _in_place(
        self, restored: AgentBlocks | None, n_restored: int, n_new: int
    ) -> RestoredPrefix | None:
        if not self._host_rows or restored is None or not self._host.addressable:
            return None
        if not 0 < n_new <= self._host_rows * IN_PLACE_PASSES:
            return None
        return RestoredPrefix.of(restored, n_restored, self._spec)

    def streams(self) -> tuple[Any, ...]:
        """Two CPU streams (two threads) for restore copies, made on the engine thread on
        first use; the device's own stream alone where its memory is not the host's."""
        if self._streams is None:
            own = mx.default_stream(mx.default_device())
            self._streams = (own, mx.new_stream(mx.cpu)) if self._host.addressable else (own,)
        return self._streams

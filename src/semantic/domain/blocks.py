"""KV blocks: one layer's keys and values for one run of up to 256 tokens."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class KVBlock:
    """One layer's KV for block ``index`` of a sequence.

    ``payload`` is the tensors themselves, opaque to every ring but the model adapter that
    made them. ``start`` is 0 except for sliding-window layers, which may keep only the tail
    of their oldest block; the block then holds positions ``start .. n_tokens - 1``.
    """

    pool_id: int
    layer: int
    index: int
    n_tokens: int
    payload: object
    start: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.n_tokens:
            raise InvalidRequestError(
                f"block {self.index} of layer {self.layer} holds positions "
                f"{self.start}..{self.n_tokens - 1}, which is empty"
            )


@dataclass(frozen=True, slots=True)
class AgentBlocks:
    """A sequence's KV as blocks, layer by layer, with the tokens it was computed from.

    ``layers[l]`` lists layer ``l``'s blocks in sequence order. A global layer has one block
    per 256 tokens (the last one partial); a sliding layer starts later, at the first block
    its window still reaches.
    """

    agent_id: str
    token_ids: tuple[int, ...]
    layers: tuple[tuple[KVBlock, ...], ...]

    @property
    def n_tokens(self) -> int:
        return len(self.token_ids)

    def __iter__(self) -> Iterator[KVBlock]:
        for layer_blocks in self.layers:
            yield from layer_blocks

    def pool_ids(self) -> list[int]:
        return [block.pool_id for block in self]

    def block_count(self) -> int:
        return sum(len(layer_blocks) for layer_blocks in self.layers)

    def validate(self, spec: ModelCacheSpec) -> None:
        """Raise ``InvalidRequestError`` unless these blocks tile the tokens as ``spec`` says."""
        if len(self.layers) != spec.n_layers:
            raise InvalidRequestError(
                f"blocks cover {len(self.layers)} layers; the model has {spec.n_layers}"
            )
        n = self.n_tokens
        for layer, layer_blocks in enumerate(self.layers):
            expected = spec.blocks_for_layer(layer, n)
            if len(layer_blocks) < expected:
                raise InvalidRequestError(
                    f"layer {layer} has {len(layer_blocks)} blocks; {n} tokens need {expected}"
                )
            first = (n - 1) // spec.block_tokens - len(layer_blocks) + 1 if n else 0
            for offset, block in enumerate(layer_blocks):
                index = first + offset
                full = min(spec.block_tokens, n - index * spec.block_tokens)
                if block.layer != layer or block.index != index or block.n_tokens != full:
                    raise InvalidRequestError(
                        f"layer {layer} block {offset} is (layer {block.layer}, index "
                        f"{block.index}, {block.n_tokens} tokens); expected (layer {layer}, "
                        f"index {index}, {full} tokens)"
                    )

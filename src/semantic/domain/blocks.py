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
        """Raise ``InvalidRequestError`` unless every block lies where ``spec`` puts it: in
        its own layer, in ascending order, full unless it is the last. Which positions the
        blocks cover is not checked here: a prefix they cannot restore is cut short by
        ``restorable_prefix`` (a stored chain may lack some sliding-window positions)."""
        if len(self.layers) != spec.n_layers:
            raise InvalidRequestError(
                f"blocks cover {len(self.layers)} layers; the model has {spec.n_layers}"
            )
        n = self.n_tokens
        for layer, layer_blocks in enumerate(self.layers):
            previous = -1
            for block in layer_blocks:
                full = min(spec.block_tokens, n - block.index * spec.block_tokens)
                if block.layer != layer or block.index <= previous or block.n_tokens != full:
                    raise InvalidRequestError(
                        f"layer {layer} holds a block (layer {block.layer}, index "
                        f"{block.index}, {block.n_tokens} tokens) after index {previous}; "
                        f"{n} tokens put {full} tokens in block {block.index} of layer {layer}"
                    )
                previous = block.index


def restorable_prefix(blocks: AgentBlocks, n_tokens: int, spec: ModelCacheSpec) -> int:
    """The longest prefix, at most ``n_tokens`` long, whose KV ``blocks`` hold in every layer:
    all its positions in a global layer, its last ``window`` in a sliding one (0 if none).

    A sliding layer keeps only the positions its window reached when its sequence was cut
    into blocks, so a prompt that leaves a stored conversation before its end may need
    positions that were never kept; a cache built over that hole would fail (or be wrong).
    Each layer can restore the lengths of a union of ranges, so the longest length all can
    restore is ``n_tokens`` itself or the end of one of those ranges."""
    if n_tokens <= 0 or len(blocks.layers) != spec.n_layers:
        return 0
    covered = [_covered(layer_blocks, spec.block_tokens) for layer_blocks in blocks.layers]
    candidates = {n_tokens, *(min(end, n_tokens) for ranges in covered for _, end in ranges)}
    for n in sorted(candidates, reverse=True):
        if n > 0 and all(
            _holds(ranges, spec.window(layer), n) for layer, ranges in enumerate(covered)
        ):
            return n
    return 0


def _covered(layer_blocks: tuple[KVBlock, ...], block_tokens: int) -> list[tuple[int, int]]:
    """The runs of positions a layer's blocks hold, as ``[start, end)`` ranges in order."""
    ranges: list[tuple[int, int]] = []
    for block in layer_blocks:
        base = block.index * block_tokens
        start, end = base + block.start, base + block.n_tokens
        if ranges and ranges[-1][1] == start:
            ranges[-1] = (ranges[-1][0], end)
        else:
            ranges.append((start, end))
    return ranges


def _holds(ranges: list[tuple[int, int]], window: int | None, n: int) -> bool:
    """Whether one range holds the positions a layer needs to continue after ``n``."""
    first = 0 if window is None else max(0, n - window)
    return any(start <= first and n <= end for start, end in ranges)

"""The KV path for device memory numpy may not view (CUDA, issue 36), forced on the CPU:
blocks cut, written, read back, gathered and continued through MLX arrays and host copies
give the bytes and the tokens the host-view path gives."""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.devices import HOST_VIEWS, HOST_VIEWS_ENV, HostMemory, host_memory
from semantic.adapters.mlx.kv.host_codec import MlxHostCodec
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.kv.kv_payloads import StackedKV, kv_arrays
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.kv_block_store import KVBlockStore
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.events import CompletionEvent
from semantic.domain.block_pool import BlockPool
from semantic.domain.blocks import AgentBlocks, KVBlock
from tests.helpers import generate, tiny_family
from tests.unit.fakes import ByteTokenizer

DEVICE_MEMORY = HostMemory(False, "forced by the test: CUDA's path on the CPU")


@dataclasses.dataclass
class Turns:
    first: CompletionEvent
    warm: CompletionEvent
    cold: CompletionEvent
    checksums: list[str]
    codec: MlxHostCodec
    exported: AgentBlocks


def model_of(family: str, dtype: str) -> Any:
    model = tiny_family(family, seed=3, vocab=256)
    if dtype == "bfloat16":
        model.set_dtype(mx.bfloat16)
        mx.eval(model.parameters())
    return model


def turns(model: Any, host: HostMemory, at_rest: str, directory: Path) -> Turns:
    """A first turn, its blocks through disk, then the next turn warm (from those blocks)
    and cold."""
    spec = spec_from_model(model)
    buffers = RestoreBuffers(max_bytes=64 << 20)
    backend = MlxBackend(model, spec, "m", frozenset(), buffers, accelerator=None, host=host)
    tokenizer = ByteTokenizer([bytes([i]) for i in range(256)])
    engine = BlockPoolBatchEngine(backend, tokenizer, BlockPool(400), EngineConfig())
    rng = random.Random(5)
    first = generate(engine, [rng.randrange(256) for _ in range(600)], 6)
    assert first.blocks is not None
    codec = MlxHostCodec(at_rest, buffers, host)
    restored, checksums = through_disk(KVBlockStore(BlockFiles(directory), codec), first.blocks)
    follow_up = [*first.blocks.token_ids, *(rng.randrange(256) for _ in range(40))]
    warm = generate(engine, follow_up, 8, cached_blocks=restored)
    cold = generate(engine, follow_up, 8)
    return Turns(first, warm, cold, checksums, codec, first.blocks)


def through_disk(store: KVBlockStore, blocks: AgentBlocks) -> tuple[AgentBlocks, list[str]]:
    """``blocks`` written one file per block index and read back."""
    by_index: dict[int, list[KVBlock]] = defaultdict(list)
    for block in blocks:
        by_index[block.index].append(block)
    read: dict[tuple[int, int], object] = {}
    checksums = []
    for index, layer_blocks in sorted(by_index.items()):
        key = f"{index:064x}"
        stored = store.save(key, layer_blocks)
        checksums.append(stored.checksum)
        for payload in store.load(key, stored.checksum):
            read[payload.layer, index] = payload.data
    layers = tuple(
        tuple(dataclasses.replace(b, payload=read[b.layer, b.index]) for b in layer)
        for layer in blocks.layers
    )
    return AgentBlocks(blocks.agent_id, blocks.token_ids, layers), checksums


@pytest.mark.parametrize(
    ("family", "dtype", "at_rest"),
    [
        ("llama", "float32", "lossless"),
        ("llama", "bfloat16", "lossless"),
        ("llama", "float32", "q8"),
        ("gemma3_text", "float32", "lossless"),  # sliding windows
    ],
)
def test_device_memory_path_gives_the_host_paths_bytes_and_tokens(
    family: str, dtype: str, at_rest: str, tmp_path: Path
) -> None:
    model = model_of(family, dtype)
    host = turns(model, HOST_VIEWS, at_rest, tmp_path / "host")
    device = turns(model, DEVICE_MEMORY, at_rest, tmp_path / "device")
    assert device.first.token_ids == host.first.token_ids
    assert device.checksums == host.checksums  # the same bytes written
    assert device.warm.error is None
    assert device.warm.stats.cached_tokens == device.exported.n_tokens
    assert device.warm.token_ids == host.warm.token_ids
    if at_rest == "lossless":  # q8 at rest is lossy: warm differs from cold by design
        assert device.warm.token_ids == device.cold.token_ids
    assert device.cold.token_ids == host.cold.token_ids


def test_the_device_path_exports_copies_and_never_cuts_into_restore_buffers(
    tmp_path: Path,
) -> None:
    """Exported tensors are host copies: zeroing them leaves the KV as it was (through a
    host view it would not, which is what a CUDA array cannot take). And a finished
    sequence's blocks are arrays of their own, not cut into the restore buffers."""
    model = model_of("llama", "float32")
    for host, views in ((HOST_VIEWS, True), (DEVICE_MEMORY, False)):
        done = turns(model, host, "lossless", tmp_path / str(views))
        blocks = list(done.exported)
        assert any(isinstance(b.payload, StackedKV) for b in blocks) is views
        before = [np.array(a) for b in blocks for a in kv_arrays(b.payload)]
        tensors, _ = done.codec.to_host(blocks)
        for tensor in tensors.values():
            tensor[...] = 0
        after = [np.array(a) for b in blocks for a in kv_arrays(b.payload)]
        same = all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))
        assert same is not views


def test_the_cpu_views_host_memory_unless_the_switch_says_not_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert host_memory() == HOST_VIEWS
    assert HOST_VIEWS.describe() == "host views (the model runs on the CPU)"
    monkeypatch.setenv(HOST_VIEWS_ENV, "0")
    forced = host_memory()
    assert not forced.addressable
    assert forced.describe() == f"MLX arrays ({HOST_VIEWS_ENV}=0)"

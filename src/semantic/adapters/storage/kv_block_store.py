"""The block store port on block files: KV payloads in, KV payloads out.

The payload tensors belong to the model adapter; a ``HostCodec`` (MLX's lives in
``semantic.adapters.mlx.kv.host_codec``) turns them into host arrays to write, and provides the
memory a read fills, so a restore copies each byte once, straight into the model's buffers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from semantic.adapters.storage.block_files import BlockFiles
from semantic.adapters.storage.safetensors_layout import TensorSpan
from semantic.domain.blocks import KVBlock
from semantic.domain.errors import CacheCorruptionError
from semantic.ports.block_store import LayerPayload, StoredFile


class HostReader(Protocol):
    def allocate(self, n_bytes: int) -> np.ndarray:
        """A writable uint8 buffer the file's data is read into."""
        ...

    def finish(
        self, spans: Mapping[str, TensorSpan], metadata: Mapping[str, str]
    ) -> list[LayerPayload]:
        """Payloads viewing the filled buffer, one per layer. ``spans`` come in file order
        (``BlockFiles.read`` checked they lie back to back from the buffer's start)."""
        ...


class HostCodec(Protocol):
    def to_host(self, blocks: Sequence[KVBlock]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """Zero-copy host views of the blocks' tensors, and the metadata to rebuild them.
        The views are valid only while ``blocks`` are held (their memory may be reused)."""
        ...

    def reader(self) -> HostReader: ...


class KVBlockStore:
    def __init__(self, files: BlockFiles, codec: HostCodec) -> None:
        self._files = files
        self._codec = codec

    def save(self, key: str, layers: Sequence[KVBlock]) -> StoredFile:
        tensors, metadata = self._codec.to_host(layers)
        nbytes, checksum = self._files.write(key, tensors, metadata)
        return StoredFile(nbytes, checksum)

    def load(self, key: str, checksum: str) -> list[LayerPayload]:
        reader = self._codec.reader()
        _, spans, metadata = self._files.read(key, checksum, reader.allocate)
        return self._finish(key, reader, spans, metadata)

    def load_bytes(self, key: str, data: bytes, checksum: str) -> list[LayerPayload]:
        reader = self._codec.reader()
        _, spans, metadata = self._files.parse(key, data, checksum, reader.allocate)
        return self._finish(key, reader, spans, metadata)

    @staticmethod
    def _finish(
        key: str, reader: HostReader, spans: Mapping[str, TensorSpan], metadata: Mapping[str, str]
    ) -> list[LayerPayload]:
        try:
            return reader.finish(spans, metadata)
        except (ValueError, KeyError, TypeError) as error:  # its checksum held: written so
            message = f"block {key[:16]} does not describe its KV: {error}"
            raise CacheCorruptionError(message) from error

    def has(self, key: str) -> bool:
        return self._files.has(key)

    def file_bytes(self, key: str, checksum: str) -> bytes | None:
        return self._files.file_bytes(key, checksum)

    def quarantine(self, key: str) -> None:
        self._files.quarantine(key)

    def delete(self, key: str) -> None:
        self._files.delete(key)

    def keys(self) -> set[str]:
        return self._files.keys()

    def remove_temporaries(self) -> int:
        return self._files.remove_temporaries()

    @property
    def space(self) -> BlockFiles:
        return self._files

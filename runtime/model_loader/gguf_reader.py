"""A lazy GGUF reader: metadata scalars and tensor locations without materializing the vocabulary arrays.

`gguf.GGUFReader` builds a numpy view for every element of every array field (~10 s for a 49k-token
vocabulary); the runtime only needs scalars and tensor offsets, and the tokenizer comes from `transformers`.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from toolkit.runtime.model_loader.errors import ModelLoadError

_SCALARS: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
MAX_KEPT_ARRAY = 4096  # longer arrays (vocabularies, merges) are skipped and recorded by length only
DEFAULT_ALIGNMENT = 32


class _HeaderError(ValueError):
    pass


@dataclass(frozen=True)
class ArrayInfo:
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    qtype: str
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def torch_shape(self) -> tuple[int, ...]:
        return tuple(reversed(self.shape))


class GGUFFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as handle:
                self.metadata, self.tensors = _read_header(handle)
        except (_HeaderError, struct.error, UnicodeDecodeError, ValueError, OverflowError, MemoryError) as exc:
            raise ModelLoadError(f"{path}: truncated or corrupt GGUF header ({exc})") from None
        self._memmap: np.memmap | None = None

    def field(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor_data(self, tensor: TensorInfo) -> np.ndarray:
        if self._memmap is None:
            self._memmap = np.memmap(self.path, dtype=np.uint8, mode="r")
        if tensor.offset + tensor.nbytes > self._memmap.size:
            raise ModelLoadError(f"{self.path}: tensor {tensor.name} extends past the end of the file (truncated?)")
        return self._memmap[tensor.offset : tensor.offset + tensor.nbytes]


def _read(handle: BinaryIO, fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = handle.read(size)
    if len(data) != size:
        raise _HeaderError("unexpected end of file")
    return struct.unpack(fmt, data)[0]


def _read_string(handle: BinaryIO) -> str:
    length = _read(handle, "<Q")
    data = handle.read(length)
    if len(data) != length:
        raise _HeaderError("unexpected end of file inside a string")
    return data.decode("utf-8")


def _read_value(handle: BinaryIO, value_type: int) -> Any:
    if value_type == GGUFValueType.STRING:
        return _read_string(handle)
    if value_type == GGUFValueType.ARRAY:
        return _read_array(handle)
    if value_type not in _SCALARS:
        raise _HeaderError(f"unknown metadata value type {value_type}")
    return _read(handle, _SCALARS[value_type])


def _read_array(handle: BinaryIO) -> list[Any] | ArrayInfo:
    item_type, length = _read(handle, "<I"), _read(handle, "<Q")
    if item_type in _SCALARS and item_type != GGUFValueType.BOOL:
        width = struct.calcsize(_SCALARS[item_type])
        if length > MAX_KEPT_ARRAY:
            handle.seek(width * length, 1)
            return ArrayInfo(length)
        return list(np.frombuffer(handle.read(width * length), dtype=np.dtype(_SCALARS[item_type])).tolist())
    items = [_read_value(handle, item_type) for _ in range(length)]
    return ArrayInfo(length) if length > MAX_KEPT_ARRAY else items


def _tensor_nbytes(shape: tuple[int, ...], qtype: GGMLQuantizationType) -> int:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    elements = int(np.prod(shape)) if shape else 1
    return elements // block_size * type_size


def _read_header(handle: BinaryIO) -> tuple[dict[str, Any], list[TensorInfo]]:
    if handle.read(4) != b"GGUF":
        raise _HeaderError("not a GGUF file: bad magic")
    version = _read(handle, "<I")
    if version not in (2, 3):
        raise _HeaderError(f"unsupported GGUF version {version}")
    tensor_count, kv_count = _read(handle, "<Q"), _read(handle, "<Q")
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = _read_string(handle)
        metadata[key] = _read_value(handle, _read(handle, "<I"))
    raw_tensors = []
    for _ in range(tensor_count):
        name = _read_string(handle)
        dims = tuple(_read(handle, "<Q") for _ in range(_read(handle, "<I")))
        type_id, offset = _read(handle, "<I"), _read(handle, "<Q")
        try:
            qtype = GGMLQuantizationType(type_id)
        except ValueError:
            raise _HeaderError(f"tensor {name} has unknown GGML type id {type_id}") from None
        raw_tensors.append((name, dims, qtype, offset))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-handle.tell() // alignment) * alignment
    tensors = [
        TensorInfo(name, dims, qtype.name, data_start + offset, _tensor_nbytes(dims, qtype))
        for name, dims, qtype, offset in raw_tensors
    ]
    return metadata, tensors

"""Arrow arrays made from numpy buffers and Python lists without `pyarrow.array`, whose converter imports pandas
(0.2 s of CPU, holding the GIL) to ask whether its input is a pandas object: `--export` never needs pandas.

Each array is assembled from its buffers (`pyarrow.Array.from_buffers`): a validity bitmap where a value is
missing, then the values (fixed-width numbers as they lie in memory, booleans packed, text as offsets and UTF-8
bytes).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pyarrow as pa

_MAX_TEXT_BYTES = 2**31 - 1  # Arrow's string arrays have 32-bit offsets


def numbers(values: np.ndarray, kind: pa.DataType | None = None, missing: np.ndarray | None = None) -> pa.Array:
    """`values` (fixed-width numbers) as an Arrow array of `kind` (by default their own type; a type of the same
    width, e.g. `timestamp("ms")` over int64, reads the same bytes), null where `missing`."""
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    kind = kind if kind is not None else pa.from_numpy_dtype(values.dtype)
    validity, nulls = _validity(missing)
    return pa.Array.from_buffers(kind, len(values), [validity, pa.py_buffer(values)], null_count=nulls)


def booleans(values: np.ndarray, missing: np.ndarray | None = None) -> pa.Array:
    """`values` (numpy booleans) as an Arrow boolean array, null where `missing`."""
    import pyarrow as pa

    validity, nulls = _validity(missing)
    packed = np.packbits(np.asarray(values, bool), bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [validity, pa.py_buffer(packed)], null_count=nulls)


def texts(values: Sequence[str | None]) -> pa.Array:
    """`values` as an Arrow string array, null where None (a character UTF-8 cannot hold, a lone surrogate,
    becomes `?`)."""
    import pyarrow as pa

    encoded = [b"" if v is None else v.encode("utf-8", "replace") for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    if offsets[-1] > _MAX_TEXT_BYTES:
        raise ValueError(f"{offsets[-1]:,} bytes of text in one column: more than an Arrow string array holds")
    validity, nulls = _validity(np.fromiter((v is None for v in values), bool, len(values)))
    buffers = [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), len(encoded), buffers, null_count=nulls)


def spans(data: bytes | bytearray, begin: np.ndarray, stop: np.ndarray, at: np.ndarray | None = None,
          length: int | None = None) -> pa.Array:
    """The ASCII text of each [begin, stop) of `data` as an Arrow string array (with `at`: span i in row `at[i]`
    of `length` rows, null in the others): the spans, with the bytes between them as strings of their own, make
    one array over `data` as it is; taking every other one copies the spans out, each to its row (spans in any
    order, none overlapping)."""
    import pyarrow as pa

    n = len(begin)
    if n == 0:
        return texts([]) if at is None else pa.nulls(length or 0, pa.string())
    order = np.argsort(begin, kind="stable") if n > 1 and not bool((begin[1:] >= begin[:-1]).all()) else None
    offsets = np.empty(2 * n + 1, np.int32)
    offsets[0] = 0
    offsets[1::2] = begin if order is None else begin[order]
    offsets[2::2] = stop if order is None else stop[order]
    every = pa.StringArray.from_buffers(2 * n, pa.py_buffer(offsets), pa.py_buffer(data))
    picks = 2 * (np.arange(n) if order is None else np.argsort(order)) + 1
    if at is None:
        return every.take(numbers(picks))
    placed = np.zeros(length, np.int64)
    placed[at] = picks
    missing = np.ones(length, bool)
    missing[at] = False
    return every.take(numbers(placed, missing=missing))


def names(codes: np.ndarray, table: list[str]) -> pa.Array:
    """An Arrow string array of `table[code]` for each of `codes`."""
    import pyarrow as pa

    return pa.DictionaryArray.from_arrays(numbers(codes.astype(np.int32)), texts(table)).cast(pa.string())


def values_of(column: pa.Array | pa.ChunkedArray, dtype: type[np.generic]) -> np.ndarray:
    """The values of a fixed-width column with no nulls, as numpy (`to_numpy` goes through pandas): each chunk's
    value buffer read in place, joined where there are several."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if any(chunk.null_count for chunk in chunks):
        raise ValueError("values_of: a column with nulls")
    parts = [np.frombuffer(chunk.buffers()[1], dtype, len(chunk), chunk.offset * np.dtype(dtype).itemsize)
             for chunk in chunks]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of `schema` with no rows (`Schema.empty_table` goes through the converter)."""
    import pyarrow as pa

    return pa.Table.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def _validity(missing: np.ndarray | None) -> tuple[pa.Buffer | None, int]:
    """(the validity bitmap of an array null where `missing`, None where nothing is; its null count)."""
    import pyarrow as pa

    nulls = 0 if missing is None else int(np.count_nonzero(missing))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(~np.asarray(missing, bool), bitorder="little")), nulls

"""What a report reads: `toolkit bench` JSONL records (strictly: a bad line is an error) and the run's window."""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from toolkit.bench.record import RecordError
from toolkit.bench.record import read_records as bench_records
from toolkit.diagnose.bench_input import to_log_clock


class ReportError(ValueError):
    """Bad input, said in one line that names the file and the problem."""


def read_records(path: str | Path) -> list[dict]:
    """Every record of one JSONL file (`bench.record`, strictly: a line that is not a bench record fails)."""
    try:
        records = bench_records(path, strict=True).records
    except RecordError as exc:
        raise ReportError(str(exc)) from None
    if not records:
        raise ReportError(f"{path}: no bench records (the file is empty)")
    return [record.to_json() for record in records]


def read_all(paths: Iterable[str | Path]) -> list[dict]:
    return [record for path in paths for record in read_records(path)]


def check_log(path: str | Path) -> Path:
    p = Path(path)
    if not p.is_file():
        raise ReportError(f"{path}: no such file")
    return p


def _unix(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def bench_window(records: Sequence[dict]) -> tuple[float, float] | None:
    """The runs' span on the log's clock, widened to whole seconds (logs often stamp to the second)."""
    starts = [t for r in records if (t := _unix(r.get("started_at"))) is not None]
    ends = [t for r in records if (t := _unix(r.get("ended_at"))) is not None]
    if not starts or not ends:
        return None
    return float(math.floor(to_log_clock(min(starts)))), float(math.ceil(to_log_clock(max(ends))))

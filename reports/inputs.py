"""What a report reads: `toolkit bench` JSONL records (strictly: a bad line is an error) and the run's window."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path

from toolkit.diagnose.bench_input import to_log_clock


class ReportError(ValueError):
    """Bad input, said in one line that names the file and the problem."""


def read_records(path: str | Path) -> list[dict]:
    """Every record of one JSONL file; blank lines are skipped, anything else that is not a JSON object fails."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read ({exc})") from None
    records = []
    for no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            records.append(_record(line, path, no))
    if not records:
        raise ReportError(f"{path}: no bench records (the file is empty)")
    return records


def _record(line: str, path: str | Path, no: int) -> dict:
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise ReportError(f"{path} line {no}: not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise ReportError(f"{path} line {no}: not a bench record (a JSON {type(record).__name__}, not an object)")
    return record


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

"""`--export events.csv|events.parquet`: the parsed timeline, one row per event with kind, time, rank, line,
source, text and every field as a column (absent fields empty)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.timeline import Timeline

FORMATS = (".csv", ".parquet")


def events_frame(timeline: Timeline) -> pd.DataFrame:
    """All events in source/line order, fields widened into columns."""
    records = []
    for rows in timeline.events.values():
        for kind, line, time, rank, text, source in rows:
            rec = {"kind": kind, "time": time, "rank": rank, "line": line, "source": source, "text": text}
            for key, value in parse_fields(kind, text).items():
                rec.setdefault(key, value)
            records.append(rec)
    df = pd.DataFrame.from_records(records, columns=None if records else
                                   ["kind", "time", "rank", "line", "source", "text"])
    df = df.sort_values(["source", "line"], kind="stable").reset_index(drop=True)
    df.insert(2, "timestamp", pd.to_datetime(df["time"], unit="s", errors="coerce"))
    return df


def write_events(timeline: Timeline, path: str | Path) -> Path:
    """Write the events to `.csv` or `.parquet` (chosen by the suffix); raises ValueError otherwise."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"--export needs a .csv or .parquet file name, not {path.name!r}")
    df = events_frame(timeline)
    if path.suffix == ".csv":
        df.to_csv(path, index=False)
        return path
    for col in df.columns:
        if df[col].dtype == object:
            kinds = {type(v) for v in df[col].dropna()}
            if kinds - {int, float} or bool in kinds:
                df[col] = df[col].map(lambda v: None if v is None or (isinstance(v, float) and v != v) else str(v))
            else:
                df[col] = pd.to_numeric(df[col])
    df.to_parquet(path, index=False)
    return path

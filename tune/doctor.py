"""Diagnose one step: `toolkit diagnose`'s `analyze` over the server log, cut to the step's bench window, with
the bench records as client-side evidence."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from toolkit.diagnose import analyze
from toolkit.bench.record import BenchRecord
from toolkit.diagnose.bench_input import BenchInput
from toolkit.reports.inputs import bench_window
from toolkit.tune.flags import Advice


class LogDoctor:
    def diagnose(self, log: Path, records: Sequence[dict]) -> tuple[tuple[Advice, ...], str | None]:
        if not log.is_file():
            return (), f"no server log at {log}"
        bench = BenchInput("tune step", tuple(BenchRecord.from_json(r) for r in records)) if records else None
        try:
            diagnosis = analyze([log], bench=bench, window=bench_window(records))
        except (OSError, EOFError, ValueError) as exc:
            return (), f"cannot read {log}: {exc}"
        return tuple(diagnosis.findings), diagnosis.verdict

"""A fleet's report: each worker's verdict and findings, the workers' loads side by side, then the fleet findings;
as terminal text or as JSON (`toolkit.diagnose.fleet/1`: each worker's full `toolkit.diagnose/1` document)."""
from __future__ import annotations

import json
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from toolkit.diagnose.fleet import FleetDiagnosis, WorkerLoad
from toolkit.diagnose.read.prefix import clock_text
from toolkit.diagnose.report_json import finding_dict, to_dict
from toolkit.diagnose.report_terminal import STYLE, finding_panel, safe

SCHEMA = "toolkit.diagnose.fleet/1"


def _number(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _loads(fleet: FleetDiagnosis) -> Table:
    window = fleet.window
    span = f" from {clock_text(window[0])} to {clock_text(window[1])}" if window else ""
    table = Table(title=f"Workers{span}", box=None, title_justify="left")
    for column in ("worker", "load lines", "running (mean)", "output tok/s", "KV usage (median)", "retractions",
                   "log ends"):
        table.add_column(column, justify="left" if column == "worker" else "right")
    for load in fleet.loads:
        table.add_row(Text(safe(load.name)), str(load.load_lines), _number(load.running), _number(load.throughput),
                      _number(load.usage, 2), str(load.retractions), clock_text(load.end) if load.end else "-")
    return table


def render_fleet(fleet: FleetDiagnosis, console: Console) -> None:
    """Print every worker's verdict and findings, the load table and the fleet findings."""
    for worker in fleet.workers:
        d = worker.diagnosis
        console.print(Panel(Text(safe(d.verdict), style=STYLE[d.status]), title=safe(f"Worker {worker.name}"),
                            subtitle=safe(worker.source), title_align="left", subtitle_align="left"))
        for f in d.findings:
            console.print(finding_panel(f))
    console.print(_loads(fleet))
    if not fleet.findings:
        console.print(Text("Fleet: no imbalance, no missing worker found.", style="green"))
    for f in fleet.findings:
        console.print(finding_panel(f))
    for note in fleet.notes:
        console.print(Text(safe(f"note: {note}"), style="dim"))


def _load_dict(load: WorkerLoad) -> dict[str, Any]:
    return {"name": load.name, **load.facts()}


def fleet_dict(fleet: FleetDiagnosis) -> dict[str, Any]:
    loads = {load.name: _load_dict(load) for load in fleet.loads}
    return {
        "schema": SCHEMA,
        "status": fleet.worst or "ok",
        "window": list(fleet.window) if fleet.window else None,
        "workers": [{"name": w.name, "source": w.source, "load": loads[w.name], "diagnosis": to_dict(w.diagnosis)}
                    for w in fleet.workers],
        "fleet_findings": [finding_dict(f) for f in fleet.findings],
        "notes": fleet.notes,
    }


def render_fleet_json(fleet: FleetDiagnosis) -> str:
    return json.dumps(fleet_dict(fleet), indent=2, default=str)

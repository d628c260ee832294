"""The `toolkit tune` page: one self-contained HTML file in the report's style (same CSS, same escaping), with
the objective per step plotted and each step's evidence — the change, the finding that drove it, the noise
test, the diagnosis and the bench runs. Input: the `tune.jsonl` step entries and the summary (`tune.journal`)."""
from __future__ import annotations

import io
import math
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from toolkit.reports.build import write_html
from toolkit.reports.charts import Image, data_uri
from toolkit.reports.render import environment

if TYPE_CHECKING:
    from toolkit.tune.journal import JournalStep

STATUS_COLOURS = {"baseline": "#1b6fa8", "kept": "#1f7a3d", "reverted": "#a86400", "failed": "#b3261e",
                  "interrupted": "#5b6575"}
RUN_COLUMNS = (("tune_repeat", "repeat"), ("cache_reset", "started from"), ("cached_tokens", "cached tokens"),
               ("request_rate", "rate (req/s)"), ("completed", "completed"), ("output_throughput", "output tok/s"),
               ("goodput", "goodput (req/s)"), ("mean_ttft_ms", "TTFT mean (ms)"), ("p99_ttft_ms", "TTFT p99 (ms)"),
               ("mean_tpot_ms", "TPOT mean (ms)"), ("duration", "duration (s)"))


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def objective_png(steps: Sequence[JournalStep], dpi: int = 90) -> bytes:
    """Mean ± spread per step coloured by outcome, and the best-so-far line the kept steps raise."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6))
    ax = fig.subplots()
    best, xs, ys = None, [], []
    for step in steps:
        if step.status in ("baseline", "kept") and _finite(step.mean):
            best = step.mean
        if best is not None:
            xs.append(step.step)
            ys.append(best)
    if xs:
        ax.step(xs, ys, where="post", color="0.55", lw=1.2, ls="--", label="best so far")
    for status, colour in STATUS_COLOURS.items():
        points = [s for s in steps if s.status == status and _finite(s.mean)]
        if points:
            ax.errorbar([s.step for s in points], [s.mean for s in points],
                        yerr=[s.spread or 0.0 for s in points], fmt="o", ms=7, capsize=4, color=colour,
                        label=status)
    failed = [s for s in steps if not _finite(s.mean)]
    for s in failed:
        ax.axvline(s.step, color=STATUS_COLOURS.get(s.status, "0.5"), lw=1, ls=":")
    unit = steps[0].unit if steps else ""
    ax.set_xlabel("step")
    ax.set_ylabel(f"{steps[0].objective if steps else 'objective'} ({unit})")
    ax.set_xticks([s.step for s in steps])
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def objective_image(steps: Sequence[JournalStep]) -> Image | None:
    if not any(_finite(s.mean) for s in steps):
        return None
    return Image(data_uri(objective_png(steps)),
                 "The objective per step: mean with its spread over the repeats, coloured by kept/reverted/failed, "
                 "and the best so far")


def run_table(step: JournalStep) -> tuple[list[str], list[list[object]]]:
    """(column labels, one row per bench run) with only the columns some run of the step has."""
    records = step.records
    columns = [(key, label) for key, label in RUN_COLUMNS if any(r.get(key) is not None for r in records)]
    return [label for _, label in columns], [[r.get(key) for key, _ in columns] for r in records]


def context(steps: Sequence[JournalStep], summary: dict, title: str | None = None) -> dict:
    from toolkit.version import __version__

    return {
        "title": title or f"toolkit tune · {summary.get('objective')}",
        "version": __version__,
        "generated": datetime.now().astimezone().isoformat(timespec="seconds"),
        "steps": list(steps),
        "s": summary,
        "chart": objective_image(steps),
        "run_table": run_table,
    }


def render_tune_page(steps: Sequence[JournalStep], summary: dict, title: str | None = None) -> str:
    return environment().get_template("tune.html.jinja").render(**context(steps, summary, title))


def write_tune_page(steps: Sequence[JournalStep], summary: dict, out: str | Path, title: str | None = None) -> Path:
    return write_html(render_tune_page(steps, summary, title), out)

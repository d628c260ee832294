"""Images for the report: curves over the rate sweep and the server timeline, as base64 PNG data URIs."""
from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import NamedTuple

from toolkit.bench.pareto import PER_USER_LABEL, TOTAL_LABEL, Point, front, points
from toolkit.reports.bench_rows import Run

MIN_SWEEP_POINTS = 2


class Image(NamedTuple):
    uri: str
    alt: str


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _number(value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if ok and math.isfinite(value) else math.nan


def x_of(run: Run) -> float:
    """Where a run sits on the rate axis: its asked rate, or for rate inf the throughput it reached."""
    return _number(run.get("request_throughput")) if math.isinf(run.rate) else run.rate


def sweep_points(rows: Sequence[Run]) -> list[Run]:
    return [r for r in rows if math.isfinite(x_of(r))]


def _panel(ax, points: Sequence[Run], keys: Sequence[tuple[str, str]], ylabel: str) -> None:
    xs = [x_of(r) for r in points]
    for key, label in keys:
        ax.plot(xs, [_number(r.get(key)) for r in points], marker="o", lw=1.5, label=label)
    saturation = [r for r in points if math.isinf(r.rate)]
    for r in saturation:
        ax.axvline(x_of(r), color="0.6", lw=0.8, ls=":")
    slow = [r for r in points if r.get("client_bottleneck") is True]
    if slow:
        ax.plot([x_of(r) for r in slow], [_number(r.get(keys[0][0])) for r in slow], "x", color="tab:red",
                ms=10, mew=2, label="client bottleneck")
    ax.set_xlabel("request rate (req/s)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _png(fig, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def sweep_png(rows: Sequence[Run], dpi: int = 90) -> bytes:
    """Output throughput, TTFT p50/p99 and TPOT p50/p99 against the request rate (rate inf at its throughput)."""
    from matplotlib.figure import Figure

    points = sweep_points(rows)
    fig = Figure(figsize=(13, 3.8))
    axes = fig.subplots(1, 3)
    _panel(axes[0], points, [("output_throughput", "output tok/s")], "tokens/s")
    _panel(axes[1], points, [("median_ttft_ms", "TTFT p50"), ("p99_ttft_ms", "TTFT p99")], "ms")
    _panel(axes[2], points, [("median_tpot_ms", "TPOT p50"), ("p99_tpot_ms", "TPOT p99")], "ms")
    axes[0].set_title("Output throughput")
    axes[1].set_title("Time to first token")
    axes[2].set_title("Time per output token")
    fig.tight_layout()
    return _png(fig, dpi)


def sweep_image(rows: Sequence[Run]) -> Image | None:
    """None when fewer than two runs have a rate to plot against."""
    if len({x_of(r) for r in sweep_points(rows)}) < MIN_SWEEP_POINTS:
        return None
    return Image(data_uri(sweep_png(rows)), "Output throughput, TTFT p50/p99 and TPOT p50/p99 vs request rate")


def _pareto_axes(ax, runs: Sequence[Point], best: Sequence[Point]) -> None:
    ax.plot([p.per_user_output_throughput for p in runs], [p.output_throughput for p in runs], "o", color="0.55",
            label="run")
    ax.plot([p.per_user_output_throughput for p in best], [p.output_throughput for p in best], "-o",
            color="tab:blue", lw=1.8, label="Pareto front")
    for p in runs:
        ax.annotate(f"rate {p.request_rate}", (p.per_user_output_throughput, p.output_throughput), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel(PER_USER_LABEL + " (1000 / mean TPOT)")
    ax.set_ylabel(TOTAL_LABEL)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Pareto front: speed per user vs total output")


def pareto_image(records: Sequence[dict], dpi: int = 90) -> Image | None:
    """The sweep's runs on (output tok/s per user, total output tok/s) with their Pareto front (`bench.pareto`,
    the rule `toolkit bench` writes into a sweep's record); None with fewer than two runs to place."""
    from matplotlib.figure import Figure

    runs = points(records)
    if len(runs) < MIN_SWEEP_POINTS:
        return None
    fig = Figure(figsize=(6.5, 4.2))
    _pareto_axes(fig.subplots(), runs, front(runs))
    fig.tight_layout()
    return Image(data_uri(_png(fig, dpi)), "Pareto front of the sweep: output tok/s per user against total output "
                                          "tok/s, one point per run")


def timeline_images(timeline) -> list[tuple[str, Image]]:
    """(rank, image) per rank of a diagnose timeline: token usage, requests, gen throughput, retractions."""
    from toolkit.diagnose.plots import plot_pngs

    return [(rank, Image(data_uri(png), f"Server timeline of rank {rank or '(single)'}: token usage, running and "
                                        "queued requests, gen throughput with retractions marked"))
            for rank, png in plot_pngs(timeline).items()]

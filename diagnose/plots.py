"""`--plots DIR`: one PNG per rank: token usage, running/queued requests, gen throughput (retractions marked)."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pandas as pd

from toolkit.diagnose.timeline import Timeline


def _safe_name(rank: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", rank).strip("-") or "server"


def _x(df: pd.DataFrame) -> pd.Series:
    return pd.to_datetime(df["time"], unit="s") if df["time"].notna().all() and len(df) else df["line"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(timeline: Timeline, rank: str, df: pd.DataFrame):
    plt = _pyplot()
    dec = df[df["kind"] == "decode"]
    x = _x(dec)
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    axes[0].plot(x, dec["usage"], lw=1, color="tab:purple")
    axes[0].set_ylabel("token usage")
    axes[0].set_ylim(0, 1.05)
    axes[1].plot(x, dec["running_req"], lw=1, label="#running-req")
    axes[1].plot(x, dec["queue_req"], lw=1, label="#queue-req")
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper right")
    axes[2].plot(x, dec["gen_throughput"], lw=1, color="tab:green", label="gen throughput")
    axes[2].set_ylabel("tokens/s")
    retract = [r for r in timeline.kind("retract") if r[3] == rank]
    for i, r in enumerate(retract):
        at = pd.to_datetime(r[2], unit="s") if x is not dec["line"] and r[2] is not None else r[1]
        axes[2].axvline(at, color="tab:red", lw=0.6, alpha=0.6, label="retraction" if i == 0 else None)
    axes[2].legend(loc="upper right")
    fig.suptitle(f"rank {rank or '(single)'}")
    fig.tight_layout()
    return fig


def write_plots(timeline: Timeline, directory: str | Path) -> list[Path]:
    """Write `timeline-<rank>.png` per rank into `directory` (created); returns the paths."""
    plt = _pyplot()
    out_dir = Path(directory)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, df in sorted(timeline.frames.items()):
        fig = _figure(timeline, rank, df)
        path = out_dir / f"timeline-{_safe_name(rank)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_pngs(timeline: Timeline, dpi: int = 90) -> dict[str, bytes]:
    """The same plots in memory, `{rank: PNG bytes}` in rank order (for the HTML report)."""
    plt = _pyplot()
    pngs = {}
    for rank, df in sorted(timeline.frames.items()):
        fig = _figure(timeline, rank, df)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        plt.close(fig)
        pngs[rank] = buf.getvalue()
    return pngs

"""`--plots DIR`: one PNG per rank: KV usage, running/queued requests, gen throughput (retractions marked)."""
from __future__ import annotations

import io
import string
from pathlib import Path

import numpy as np

from toolkit.diagnose.timeline import Timeline


_NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits)


def _safe_name(rank: str) -> str:
    """The rank as a file name: its runs of other characters than letters and digits one `-` (none at the ends)."""
    return "-".join("".join(c if c in _NAME_CHARACTERS else " " for c in rank).split()) or "server"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _figure(timeline: Timeline, rank: str):
    plt = _pyplot()
    load = timeline.load()
    rows = load.of_rank(rank)
    times = rows["time"]
    timed = len(times) > 0 and bool(np.isfinite(times).all())
    x = times.astype("datetime64[s]") if timed else rows["line"]
    fig, axes = plt.subplots(3, 1, figsize=(11, 8), sharex=True)
    axes[0].plot(x, rows["usage"], lw=1, color="tab:purple")
    axes[0].set_ylabel("KV usage")
    axes[0].set_ylim(0, 1.05)
    axes[1].plot(x, rows["running_req"], lw=1, label="running")
    axes[1].plot(x, rows["queue_req"], lw=1, label="queued")
    axes[1].set_ylabel("requests")
    axes[1].legend(loc="upper right")
    axes[2].plot(x, rows["gen_throughput"], lw=1, color="tab:green", label="gen throughput")
    axes[2].set_ylabel("tokens/s")
    marks = [e for e in timeline.kind("retract") + timeline.kind("preempt") if e.rank == rank]
    for i, e in enumerate(marks):
        if timed and e.time is None:
            continue
        at = np.datetime64(int(e.time), "s") if timed else e.line
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
    for rank in timeline.ranks:
        fig = _figure(timeline, rank)
        path = out_dir / f"timeline-{_safe_name(rank)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_pngs(timeline: Timeline, dpi: int = 90) -> dict[str, bytes]:
    """The same plots in memory, `{rank: PNG bytes}` in rank order (for the HTML report)."""
    plt = _pyplot()
    pngs = {}
    for rank in timeline.ranks:
        fig = _figure(timeline, rank)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        plt.close(fig)
        pngs[rank] = buf.getvalue()
    return pngs

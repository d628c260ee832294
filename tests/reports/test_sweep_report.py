"""The report of a `toolkit bench --sweep` run: its section shows the sweep's curves, plotted from the sweep's own
records (every run a point, the saturation run at the throughput it reached), and its table a row per run."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.reports import charts
from tests.bench.stub import Script, StubServer, ThreadedStub
from tests.reports.conftest import read_jsonl
from tests.reports.page import Page

PNG = b"\x89PNG\r\n\x1a\n"
# what a reader sees in the legend → the record field it must show
CURVES = {"output tok/s": "output_throughput", "TTFT p50": "median_ttft_ms", "TTFT p99": "p99_ttft_ms",
          "TPOT p50": "median_tpot_ms", "TPOT p99": "p99_tpot_ms"}


def _cli(args: list[str]):
    # NOTE: a thread of its own, so bench's event loop never meets one already running.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(CliRunner().invoke, app, args).result(timeout=300)


def test_the_report_of_a_sweep_plots_every_run_of_it(tmp_path, monkeypatch):
    runs = tmp_path / "sweep.jsonl"
    stub = StubServer(default=Script(ttft=0.01, chunks=((0.0, 1), (0.004, 1), (0.004, 1), (0.004, 1))))
    with ThreadedStub(stub) as served:
        result = _cli(["bench", "--base-url", served.base_url, "--dataset", "random", "--random-input-len", "16",
                       "--random-output-len", "4", "--seed", "3", "--num-prompts", "6", "--sweep", "--output-file",
                       str(runs), "--no-progress"])
    assert result.exit_code == 0, result.output
    records = read_jsonl(runs)
    assert [r["sweep"]["role"] for r in records] == ["saturation"] + ["rate"] * (len(records) - 1)
    assert len(records) >= 3

    plotted: dict[str, tuple[list[float], list[float]]] = {}
    panel = charts._panel

    def spy(ax, points, keys, ylabel):  # records what reaches matplotlib: each curve's label, x and y
        plot = ax.plot

        def recording_plot(xs, ys, *args, **kwargs):
            plotted[kwargs.get("label")] = (list(xs), list(ys))
            return plot(xs, ys, *args, **kwargs)

        ax.plot = recording_plot
        return panel(ax, points, keys, ylabel)

    monkeypatch.setattr(charts, "_panel", spy)
    out = tmp_path / "report.html"
    result = _cli(["report", "--bench", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    html = out.read_text(encoding="utf-8")

    sweep = html[html.index('<section id="sweep">') : html.index("</section>", html.index('<section id="sweep">'))]
    image, _pareto = Page(sweep).images()
    assert image.startswith(PNG) and len(image) > 10_000
    expected = sorted((r["request_throughput"] if r["request_rate"] == "inf" else r["request_rate"], i)
                      for i, r in enumerate(records))
    assert set(plotted) - {"client bottleneck"} == set(CURVES)  # the marker is added where the client lagged
    for label, field in CURVES.items():
        xs, ys = plotted[label]
        assert xs == [x for x, _ in expected], f"{label}: one point per run, in rate order"
        assert ys == [records[i][field] for _, i in expected], label
    assert records[0]["request_throughput"] in plotted["output tok/s"][0]  # the saturation run, at its throughput
    tables = Page(html).sections["tables"]
    assert all(f"{r['completed']} / {r['num_requests']}" in tables for r in records)

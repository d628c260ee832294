"""The Pareto view of a sweep: the report's sweep section plots every run on (output tok/s per user, total output
tok/s) and joins the front that `toolkit bench` wrote into the sweep's last record; a sweep that stopped early
says so there."""
from __future__ import annotations

from dataclasses import asdict

from tests.bench.stub import Script, StubServer, ThreadedStub
from tests.reports.conftest import read_jsonl
from tests.reports.page import Page
from tests.reports.test_sweep_report import _cli
from toolkit.bench.pareto import points
from toolkit.reports import charts
from toolkit.reports.build import render_report

PNG = b"\x89PNG\r\n\x1a\n"


def _sweep_section(html: str) -> str:
    start = html.index('<section id="sweep">')
    return html[start: html.index("</section>", start)]


def test_the_sweep_section_plots_the_runs_and_the_pareto_front_of_the_record(tmp_path, monkeypatch):
    runs = tmp_path / "rates.jsonl"
    stub = StubServer(default=Script(ttft=0.01, chunks=((0.0, 1), (0.004, 1), (0.004, 1))), capacity=2)
    with ThreadedStub(stub) as served:
        result = _cli(["bench", "--base-url", served.base_url, "--dataset", "random", "--random-input-len", "16",
                       "--random-output-len", "3", "--seed", "3", "--num-prompts", "8", "--rate", "20,100,inf",
                       "--output-file", str(runs), "--no-progress"])
    assert result.exit_code == 0, result.output
    records = read_jsonl(runs)
    pareto = records[-1]["pareto"]
    assert len(records) == 3 and pareto["points"] == 3 and "pareto" not in records[0]

    drawn = {}
    axes = charts._pareto_axes

    def spy(ax, all_runs, best):
        drawn["runs"], drawn["best"] = all_runs, best
        return axes(ax, all_runs, best)

    monkeypatch.setattr(charts, "_pareto_axes", spy)
    out = tmp_path / "report.html"
    result = _cli(["report", "--bench", str(runs), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert drawn["runs"] == points(records)
    assert [asdict(p) for p in drawn["best"]] == pareto["front"]  # the report's front is the record's

    page = Page(_sweep_section(out.read_text(encoding="utf-8")))
    curves, front = page.images()
    assert front.startswith(PNG) and len(front) > 10_000
    assert any(a.get("alt", "").startswith("Pareto front of the sweep") for t, a in page.tags if t == "img")


def test_a_sweep_that_stopped_early_says_so_and_one_run_draws_no_front():
    run = {"request_rate": 8.0, "mean_tpot_ms": 10.0, "output_throughput": 100.0, "completed": 1,
           "num_requests": 1}
    stopped = {**run, "request_rate": 16.0, "mean_tpot_ms": 40.0, "output_throughput": 150.0,
               "stopped_early": {"rate": 16.0, "reason": "TTFT p50 grew from 10 ms to 90 ms", "skipped": [32.0]}}
    both = Page(_sweep_section(render_report([run, stopped], None)))
    assert len(both.images()) == 2
    text = both.sections["sweep"]
    assert "stopped early at rate 16 req/s, past saturation: TTFT p50 grew from 10 ms to 90 ms" in text
    assert "skipped rates 32.0 req/s" in text
    one = Page(_sweep_section(render_report([run], None)))
    assert one.images() == [] and "stopped early" not in one.sections["sweep"]

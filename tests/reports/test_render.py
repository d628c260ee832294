"""The renderer: sections, escaping, self-containment, the window cut, and what each section says without data."""
from __future__ import annotations

import json
import math

import pytest

from toolkit.bench.outcome import RequestOutcome
from toolkit.bench.verdict import judge
from toolkit.reports import render_report
from toolkit.reports.build import diagnose_log
from toolkit.reports.charts import x_of
from toolkit.reports.inputs import ReportError, bench_window, read_records
from toolkit.reports.render import num
from toolkit.reports.bench_rows import runs
from tests.diagnose import logfactory as lf
from tests.diagnose.logfactory import Log
from tests.reports.conftest import (ERA, ERROR_BODY, EVIL_ERROR, EVIL_MODEL, EVIL_UNREAD, RATES, SECTION_IDS,
                                    write_log)
from tests.reports.page import Page

PNG = b"\x89PNG\r\n\x1a\n"


def test_every_section_is_there_with_its_stable_id(report_html):
    page = Page(report_html)
    assert tuple(page.sections) == SECTION_IDS
    assert page.title == "Stub sweep"
    assert all(f'href="#{s}"' in report_html for s in SECTION_IDS)


def test_log_lines_and_response_bodies_are_text_not_markup(report_html):
    page = Page(report_html)
    assert not [tag for tag, _ in page.tags if tag in ("script", "b", "iframe", "object", "embed")]
    assert "<script" not in report_html.lower() and ERROR_BODY not in report_html
    assert "&lt;b&gt;upstream exploded&lt;/b&gt;" in report_html
    assert ERROR_BODY in page.sections["tables"]
    assert EVIL_MODEL in page.sections["config"]
    assert EVIL_ERROR in page.sections["diagnosis"] and EVIL_UNREAD in page.sections["diagnosis"]
    assert "<script>document.title=" in page.sections["diagnosis"]  # the corrected command quotes the model


def test_nothing_is_fetched_from_anywhere_and_images_are_data_uris(report_html):
    page = Page(report_html)
    assert all(u.startswith(("data:", "#")) for u in page.urls()), page.urls()
    assert not [a for t, a in page.tags if t == "link" and a.get("rel") != "icon"]
    assert "url(" not in page.style and "@import" not in page.style
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy")
    assert "default-src 'none'" in csp and "img-src data:" in csp
    images = page.images()
    assert len(images) == 3  # the sweep curves, the sweep's Pareto front and one timeline (a single rank)
    assert all(png.startswith(PNG) and len(png) > 10_000 for png in images)


def test_tables_have_one_row_per_rate_with_the_records_numbers(report_html, records):
    text = Page(report_html).sections["tables"]
    for r in records:
        assert f"{r['completed']} / {r['num_requests']}" in text
        assert f"{r['median_ttft_ms']:,.2f}" in text and f"{r['p99_tpot_ms']:,.2f}" in text
    assert sum(r["failed"] for r in records) > 0 and "http_500 ×" in text
    verdict = Page(report_html).sections["verdict"]
    assert all(r["client_verdict"] in verdict for r in records)


def test_rows_go_by_rate_with_the_saturation_run_last():
    rows = runs([{"request_rate": "inf", "request_throughput": 9.0}, {"request_rate": 4.0}, {"request_rate": 1}])
    assert [r.rate_label for r in rows] == ["1", "4", "inf"] and [r.number for r in rows] == [3, 2, 1]
    assert x_of(rows[-1]) == 9.0 and x_of(rows[0]) == 1.0


def test_the_log_is_cut_to_the_bench_window(records, server_log):
    d = diagnose_log(records, server_log)
    t0, t1 = bench_window(records)
    assert d.window == (t0, t1) and t0 == math.floor(t0) and t1 - t0 < 30
    decode = d.timeline.series("decode")
    assert len(decode) and ((t0 <= decode["time"]) & (decode["time"] <= t1)).all()
    assert 0 < len(d.timeline.kind("retract")) < d.stats.kinds["retract"]
    assert len(decode) < d.stats.kinds["decode"] / 10


def test_diagnosis_shows_findings_advice_evidence_and_the_corrected_command(report_html):
    page = Page(report_html)
    text = page.sections["diagnosis"]
    assert "Server crashed" in text and "crash.exception" in text
    assert "change: --mem-fraction-static 0.920" in " ".join(text.split()) and "(now: 0.85)" in text
    assert "Trade-off:" in text and "Evidence: 1 record" in text
    assert page.ids.get("command") == "pre" and "python -m sglang.launch_server --model-path" in text
    assert "retraction" in page.sections["timeline"] and "bench run's window" in page.sections["timeline"]


def test_bench_alone_and_log_alone_say_what_is_missing(records, server_log):
    bench_only = Page(render_report(records, None)).sections
    assert "No server log was given" in bench_only["timeline"] and "No server log" in bench_only["diagnosis"]
    assert "No server log" in bench_only["config"] and "stub-model" in bench_only["config"]
    log_only = Page(render_report([], diagnose_log([], server_log))).sections
    for section in ("verdict", "tables", "sweep"):
        assert "No bench records were given" in log_only[section]
    assert "the whole log" in log_only["timeline"] and "Server crashed" in log_only["diagnosis"]


def test_one_rate_has_no_curve(records):
    page = Page(render_report(records[:1], None))
    assert "One rate only" in page.sections["sweep"] and page.images() == []


def test_a_slow_client_is_flagged_on_the_verdict(records):
    outcomes = []
    for i in range(100):
        out = RequestOutcome(i, i / 50.0, 1)
        out.dispatched = out.sent = 100.0 + i / 50.0 + i * 0.002
        outcomes.append(out)
    slow = records[0] | judge(outcomes, 100.0).as_record()
    page = Page(render_report([slow, *records[1:]], None))
    assert f"bottleneck in 1 of {len(records)} runs (rate {RATES[0]:g} req/s)" in page.sections["verdict"]
    assert "could not keep up" in page.sections["verdict"]


def test_a_log_outside_the_window_is_called_out(records, tmp_path):
    moved = [r | {"started_at": r["started_at"] + 3600, "ended_at": r["ended_at"] + 3600} for r in records]
    d = diagnose_log(moved, write_log(records, tmp_path / "server.log"))
    text = Page(render_report(moved, d)).sections["timeline"]
    assert "None of the log's" in text and "decode lines fall inside the bench window" in text


def test_a_log_without_decode_lines_says_why_there_is_no_timeline(tmp_path):
    log = Log(ERA).start(model_path="m")
    for _ in range(5):
        log.add(lf.prefill(ERA, new_seq=1, new_token=30, cached=0, running=0, queue=0), dt=1)
    path = tmp_path / "server.log"
    path.write_text(log.text())
    page = Page(render_report([], diagnose_log([], path)))
    assert "no decode or stats lines" in page.sections["timeline"]
    assert "--decode-log-interval" in page.sections["timeline"]
    assert page.images() == []
    diagnosis = page.sections["diagnosis"]
    assert "NOT ENOUGH DATA" in diagnosis and "insufficient" in diagnosis and "Rules that could not judge" in diagnosis


@pytest.mark.parametrize("content,problem", [
    ("", "no bench records"),
    ('{"request_rate": 1}\n{"request_rate": \n', "line 2: not JSON"),
    ("[1, 2]\n", "line 1: not a bench record"),
])
def test_bad_records_are_named_errors(tmp_path, content, problem):
    path = tmp_path / "runs.jsonl"
    path.write_text(content)
    with pytest.raises(ReportError, match=problem):
        read_records(path)


def test_blank_lines_are_fine_and_missing_files_are_errors(tmp_path, records):
    path = tmp_path / "runs.jsonl"
    path.write_text("\n" + json.dumps(records[0]) + "\n\n")
    assert read_records(path) == [records[0]]
    with pytest.raises(ReportError, match="no such file"):
        read_records(tmp_path / "missing.jsonl")


def test_numbers_are_formatted_for_tables():
    assert [num(None), num(float("nan")), num(1234567), num(3.14159), num(2.5, 1), num(True), num("inf")] == \
        ["-", "-", "1,234,567", "3.14", "2.5", "yes", "inf"]

"""The `toolkit tune` page: every step with its evidence, the objective chart, and nothing from a log or a flag
ever rendered as markup."""
from __future__ import annotations

import re

from toolkit.reports.tune_page import objective_png, render_tune_page, write_tune_page
from toolkit.tune.journal import JournalStep

EVIL = "<script>window.__pwned=1</script>"


def _step(index: int, status: str, values: list[float], **changes) -> JournalStep:
    mean = sum(values) / len(values) if values else None
    step = {
        "step": index, "status": status, "flags": {"--schedule-conservativeness": "2"},
        "command": f"toolkit serve --served-model-name '{EVIL}'", "change": None, "finding": None,
        "objective": "throughput", "unit": "tok/s", "values": values, "mean": mean, "spread": 1.0 if values else None,
        "delta": None, "relative": None, "threshold": None, "against": None, "error": None,
        "verdict": f"NEEDS TUNING: {EVIL}", "findings": [], "records": [], "folder": "/tmp/step", "seconds": 42.0,
        "started": 0.0,
    }
    return JournalStep.from_json(step | changes)


def steps() -> list[JournalStep]:
    finding = {"id": "usage.low_while_queued", "severity": "warning", "title": f"Requests queued {EVIL}",
               "flag": "--schedule-conservativeness", "suggested": "0.3", "current": "2"}
    full = finding | {"message": f"usage was low {EVIL}", "tradeoff": "watch retractions",
                      "evidence": "19 of 19 lines (100%)", "facts": {"median_usage": "0.153"}}
    change = {"flag": "--schedule-conservativeness", "from": "2", "to": "0.3",
              "text": "--schedule-conservativeness 2 → 0.3"}
    record = {"request_rate": "inf", "completed": 84, "output_throughput": 120.5, "mean_ttft_ms": 2000.0,
              "p99_ttft_ms": 4000.0, "mean_tpot_ms": 50.0, "duration": 6.2}
    return [
        _step(0, "baseline", [78.0, 80.0], findings=[full], records=[record]),
        _step(1, "kept", [119.0, 121.0], change=change, finding=finding, delta=41.0, relative=41 / 79,
              threshold=4.0, against=0, records=[record, record]),
        _step(2, "failed", [], change=change | {"text": f"--schedule-policy fcfs → {EVIL}"}, finding=finding,
              error=f"launch failed: {EVIL}", against=1),
    ]


SUMMARY = {"objective": "throughput", "unit": "tok/s", "reason": "nothing actionable is left", "seconds": 123.0,
           "steps": 2, "kept": [1], "start": {"mean": 79.0, "spread": 1.4, "command": "toolkit serve A"},
           "best": {"step": 1, "mean": 120.0, "spread": 1.4, "command": f"toolkit serve {EVIL}"},
           "gain": 120 / 79 - 1}


def test_the_page_shows_every_step_its_evidence_and_the_gain(tmp_path):
    html = write_tune_page(steps(), SUMMARY, tmp_path / "tune.html").read_text()
    for anchor in ('id="summary"', 'id="command"', 'id="chart"', 'id="steps"', 'id="row-2"', 'id="step-1"',
                   'id="gain">+52%', "data:image/png;base64,", "--schedule-conservativeness 2 → 0.3",
                   "19 of 19 lines (100%)", "median_usage", "120.5", "nothing actionable is left"):
        assert anchor in html, anchor
    text = " ".join(html.split())
    assert "+41.0 tok/s, more than the 4.0 the noise rule asks for, so the change was kept" in text
    assert html.count('class="badge ok">kept') == 2


def test_nothing_from_a_log_or_a_flag_becomes_markup():
    html = render_tune_page(steps(), SUMMARY)
    assert "<script>" not in html and "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in html
    assert not re.search(r"<(?!!DOCTYPE|/?(html|head|meta|link|title|style|body|header|h[123]|p|nav|a|main|div|strong|span|"
                         r"section|pre|code|img|table|tr|th|td|article|details|summary|em|dl|dt|dd)\b)", html)


def test_a_run_without_measurements_has_no_chart_but_still_renders():
    only_failed = [_step(0, "failed", [], error="launch failed: OOM")]
    summary = SUMMARY | {"start": None, "best": None, "gain": None, "steps": 0}
    html = render_tune_page(only_failed, summary)
    assert "no complete measurement" in html and "data:image/png" not in html and "launch failed: OOM" in html


def test_the_chart_is_a_png():
    assert objective_png(steps()).startswith(b"\x89PNG")


def test_each_repeat_is_shown_with_how_it_started_clean() -> None:
    runs = [{"tune_repeat": i, "cache_reset": "flush_cache", "cached_tokens": 0, "completed": 32,
             "output_throughput": value} for i, value in enumerate((41.5, 43.0))]
    page = render_tune_page([_step(0, "baseline", [41.5, 43.0], records=runs, cache_reset=["flush_cache"])],
                            {"objective": "throughput", "unit": "tok/s", "steps": 0, "seconds": 60.0,
                             "reason": "the step budget is spent (0 steps)", "gain": None,
                             "start": None, "best": None})
    assert "Each repeat started clean — flush_cache" in page
    assert "<th>repeat</th><th>started from</th><th>cached tokens</th>" in page
    assert "<td class=\"n\">flush_cache</td>" in page and "41.5, 43.0" in page

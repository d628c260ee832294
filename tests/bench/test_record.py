"""The bench record's one definition (`bench.record`): the writer goes through it, every reader reads through it, and
a record written by `toolkit bench` comes back byte for byte."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.bench.test_cli import SMALL
from toolkit.bench.output import append_record
from toolkit.bench.record import BenchRecord, RecordError, read_records
from toolkit.cli import app


def test_a_record_written_by_toolkit_bench_round_trips_exactly(tmp_path, threaded_stub):
    out = tmp_path / "runs.jsonl"
    with threaded_stub() as stub:
        for rate in ("100", "inf"):
            result = CliRunner().invoke(app, [
                "bench", "--base-url", stub.base_url, *SMALL, "--num-prompts", "4", "--rate", rate, "--slo",
                "ttft:1000", "--scrape-metrics", "--scrape-interval", "0.05", "--output-file", str(out),
                "--output-details"])
            assert result.exit_code == 0, result.output
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    for line in lines:
        record = BenchRecord.from_json(json.loads(line))
        assert json.dumps(record.to_json()) == line
    first, last = read_records(out, strict=True).records
    assert first.request_rate == 100.0 and last.request_rate == "inf" and first.completed == 4
    assert first.slo == {"ttft": 1000.0} and len(first.requests) == 4 and first.scraped_metrics
    assert "total_output_tokens" in first.extra and isinstance(first.client_verdict, str)


def test_a_key_of_the_wrong_type_is_named():
    with pytest.raises(ValueError, match="key 'completed' is a JSON string, not int"):
        BenchRecord.from_json({"request_rate": 1.0, "completed": "8"})
    with pytest.raises(ValueError, match="key 'duration' is a JSON boolean"):
        BenchRecord.from_json({"duration": True})
    with pytest.raises(ValueError, match="key 'slo'"):
        BenchRecord.from_json({"slo": {"ttft": "fast"}})
    with pytest.raises(ValueError, match="a JSON array, not an object"):
        BenchRecord.from_json([1, 2])


def test_nulls_and_absent_keys_stay_as_they_were():
    obj = {"zeta": 1, "completed": None, "request_rate": 2}
    record = BenchRecord.from_json(obj)
    assert record.to_json() == obj and list(record.to_json()) == ["zeta", "completed", "request_rate"]
    assert record.completed is None and record.duration is None and record.extra == {"zeta": 1}


def test_a_record_built_in_code_writes_its_set_keys_then_extra():
    assert BenchRecord(completed=3, duration=1.5, extra={"seed": 1}).to_json() == {
        "completed": 3, "duration": 1.5, "seed": 1}


def test_the_writer_refuses_a_record_its_readers_would_not_read(tmp_path):
    path = tmp_path / "runs.jsonl"
    with pytest.raises(ValueError, match="'client_verdict'"):
        append_record(path, {"completed": 1, "client_verdict": 3})
    assert not path.exists()


def test_a_strict_read_names_the_file_and_line_a_lenient_one_skips_and_counts(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text('{"completed": 1}\n\n{"completed": \n[1]\n{"completed": "x"}\n{"completed": 2}\n')
    with pytest.raises(RecordError, match=r"runs.jsonl line 3: not JSON"):
        read_records(path, strict=True)
    read = read_records(path, strict=False)
    assert [r.completed for r in read.records] == [1, 2] and read.skipped == 3
    path.write_text('{"completed": 1}\n{"completed": "x"}\n')
    with pytest.raises(RecordError, match=r"line 2: not a bench record \(key 'completed'"):
        read_records(path, strict=True)
    with pytest.raises(RecordError, match="no such file"):
        read_records(tmp_path / "missing.jsonl", strict=False)

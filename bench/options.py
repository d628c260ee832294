"""Parsing of the flags that carry small languages (rate lists, SLOs, the extra request body), and the errors the
command reports in one line."""
from __future__ import annotations

import json
import math
import re

from toolkit.bench.metrics import SLO_METRICS


class UsageError(ValueError):
    """A flag's value is wrong; the message names the flag and what it accepts."""


class WorkerError(RuntimeError):
    """A `--workers` process died mid-run: its share of the requests is lost, so there is no whole record to write
    (exit 1, one line)."""


def parse_rates(text: str) -> list[float]:
    """`"8"`, `"inf"` or `"1,2,4,8"` -> rates in req/s."""
    rates = []
    for part in text.split(","):
        try:
            rate = float(part.strip())
        except ValueError:
            raise UsageError(f"--rate {text!r}: expected a number, 'inf', or a comma list like 1,2,4,8") from None
        if not rate > 0 or math.isnan(rate):
            raise UsageError(f"--rate {text!r}: every rate must be positive")
        rates.append(rate)
    return rates


def parse_slo(items: list[str]) -> dict[str, float]:
    """`["ttft:200 tpot:50", "e2e:3000"]` -> {"ttft": 200.0, "tpot": 50.0, "e2e": 3000.0} (milliseconds)."""
    slo: dict[str, float] = {}
    for item in (part for text in items for part in re.split(r"[\s,]+", text.strip()) if part):
        name, _, value = item.partition(":")
        if name not in SLO_METRICS:
            raise UsageError(f"--slo {item!r}: the metric must be one of {', '.join(SLO_METRICS)}")
        try:
            slo[name] = float(value)
        except ValueError:
            raise UsageError(f"--slo {item!r}: expected METRIC:MILLISECONDS, e.g. ttft:200") from None
        if not slo[name] > 0:
            raise UsageError(f"--slo {item!r}: the limit must be a positive number of milliseconds")
    return slo


def parse_extra_body(text: str | None) -> dict:
    if not text:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--extra-request-body is not valid JSON: {exc.msg}") from None
    if not isinstance(body, dict):
        raise UsageError("--extra-request-body must be a JSON object")
    return body


def parse_json_schema(path) -> str | None:
    """`--json-schema FILE`: the schema's JSON text (checked to be a JSON object)."""
    if path is None:
        return None
    try:
        schema = json.loads(open(path, encoding="utf-8").read())
    except OSError as exc:
        raise UsageError(f"--json-schema {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--json-schema {path}: not valid JSON ({exc.msg})") from None
    if not isinstance(schema, dict):
        raise UsageError(f"--json-schema {path}: must hold a JSON schema object")
    return json.dumps(schema)


def rate_label(rate: float) -> float | str:
    return "inf" if math.isinf(rate) else rate

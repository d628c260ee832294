"""What `tune` writes: one JSON line per step (`tune.jsonl`) and a summary (`summary.json`).

Step line: `step`, `status` (baseline|kept|reverted|failed|interrupted), `flags` ({flag: value}, true for a
switch), `command` (the launch line), `change` ({"flag", "from", "to", "text"} or null), `finding` (the one that
drove the step: {"id", "severity", "title", "flag", "suggested", "current", "change"} or null; `change` is the
finding's typed change as in `toolkit diagnose --format json`, docs/diagnose-json.md), `objective`, `unit`,
`values` (one per repeat), `mean`, `spread` (sample standard deviation), `interval` (the mean's Student-t 95 %
interval as `toolkit bench --repeats` reports it: mean, ci_low, ci_high, half_width, std, n), `delta`, `relative`,
`threshold` (the gain the noise rule asked for) and `against` (the step compared with), `error`, `verdict` (diagnose's line),
`findings` (every finding of the step, with `message`, `tradeoff`, `evidence` text and `facts`), `records` (the
step's bench records), `cache_reset` (how its repeats started clean: "flush_cache", "reset_prefix_cache" or
"fresh-seed", see `tune.workload`), `folder` (its server log and output), `seconds`, `started` (seconds since the
start). The summary adds `runs` (bench runs over all steps).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toolkit.bench.output import clean
from toolkit.diagnose.report_json import change_dict
from toolkit.tune.flags import Advice, Value, show
from toolkit.tune.loop import Result, Step
from toolkit.tune.objective import UNITS


def finding_entry(f: Advice, full: bool = False) -> dict:
    entry = {k: getattr(f, k, None) for k in ("id", "severity", "title", "flag", "suggested", "current")}
    entry["change"] = change_dict(f.change, getattr(f, "engine", "sglang")) if f.change is not None else None
    if full:
        entry |= {"message": getattr(f, "message", None), "tradeoff": getattr(f, "tradeoff", None)}
        if getattr(f, "evidence", None) is not None:
            from toolkit.reports.diagnosis_rows import evidence_summary, facts

            entry |= {"evidence": evidence_summary(f), "facts": dict(facts(f))}
    return entry


@dataclass(frozen=True, slots=True, kw_only=True)
class StepChange:
    """The flag a step changed: from what, to what, said in words."""

    flag: str
    before: str
    after: str
    text: str

    def to_json(self) -> dict[str, str]:
        return {"flag": self.flag, "from": self.before, "to": self.after, "text": self.text}

    @classmethod
    def from_json(cls, obj: dict[str, str]) -> StepChange:
        return cls(flag=obj["flag"], before=obj["from"], after=obj["to"], text=obj["text"])


@dataclass(frozen=True, slots=True, kw_only=True)
class JournalStep:
    """One line of `tune.jsonl` (the module docstring says what each key holds): written by `step_entry`, read back
    by `read_steps` for the page."""

    step: int
    status: str
    flags: dict[str, Value]
    command: str
    change: StepChange | None
    finding: dict[str, Any] | None
    objective: str
    unit: str
    values: list[float]
    mean: float | None
    spread: float | None
    interval: dict[str, Any] | None = None
    delta: float | None = None
    relative: float | None = None
    threshold: float | None = None
    against: int | None = None
    error: str | None = None
    verdict: str | None = None
    findings: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    records: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    cache_reset: list[str] | None = None
    folder: str | None = None
    seconds: float = 0.0
    started: float = 0.0

    def to_json(self) -> dict[str, Any]:
        entry = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        entry["change"] = self.change.to_json() if self.change is not None else None
        return clean(entry)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> JournalStep:
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in obj.items() if k in names}
        change = known.pop("change", None)
        return cls(**known, change=StepChange.from_json(change) if change is not None else None)


def step_entry(step: Step, objective: str, command: str) -> JournalStep:
    change = None
    if step.change is not None and step.base is not None:
        change = StepChange(flag=step.change.flag, before=show(step.base.get(step.change.flag)),
                            after=show(step.change.value), text=step.change.describe(step.base))
    sample, comparison = step.sample, step.comparison
    trial = step.trial
    return JournalStep(
        step=step.index, status=step.status, flags=dict(step.flags.items), command=command, change=change,
        finding=finding_entry(step.finding) if step.finding is not None else None,
        objective=objective, unit=UNITS[objective], values=list(trial.values),
        mean=sample.mean if sample.n else None, spread=sample.spread if sample.n else None,
        interval=sample.interval.as_record() if sample.n else None,
        delta=comparison.delta if comparison else None, relative=comparison.relative if comparison else None,
        threshold=comparison.threshold if comparison else None, against=step.against,
        error=trial.error, verdict=trial.verdict,
        findings=[finding_entry(f, full=True) for f in trial.findings], records=list(trial.records),
        cache_reset=sorted({r["cache_reset"] for r in trial.records if r.get("cache_reset")}) or None,
        folder=trial.folder, seconds=trial.seconds, started=step.started)


def append_step(path: Path, entry: JournalStep) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry.to_json()) + "\n")


def summary(result: Result, objective: str, best_command: str | None, start_command: str) -> dict:
    start, best = result.start, result.best
    gain = None
    if start is not None and best is not None and start.sample.mean > 0:
        gain = best.sample.mean / start.sample.mean - 1.0
    return clean({
        "objective": objective, "unit": UNITS[objective], "reason": result.reason, "seconds": result.seconds,
        "steps": len(result.steps) - 1 if result.steps else 0,
        "runs": sum(len(s.trial.values) for s in result.steps),
        "kept": [s.index for s in result.steps if s.status == "kept"],
        "start": {"mean": start.sample.mean, "spread": start.sample.spread, "command": start_command}
        if start else None,
        "best": {"step": best.index, "mean": best.sample.mean, "spread": best.sample.spread,
                 "command": best_command} if best else None,
        "gain": gain,
    })


def read_steps(path: Path) -> list[JournalStep]:
    return [JournalStep.from_json(json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]

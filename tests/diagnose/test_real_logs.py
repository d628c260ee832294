"""The real-log corpus (tests/diagnose/real_logs/): excerpts of SGLang and vLLM logs quoted from public GitHub issues,
each with a sidecar of what an expert reads in it. Every run scores the whole corpus on four things, prints the
table, and fails on any drop from the committed scores (real_logs/scores.json):

- reading: the events diagnose reads equal the sidecar's counts, for every kind the sidecar names and for the load
  and error kinds (`ALWAYS_SCORED`, 0 when the sidecar does not name them);
- advice: every flag of the sidecar's `advice` is among the flags of diagnose's findings (files with advice only);
- quiet: no warning or critical finding (files whose sidecar says `nothing_to_advise` only);
- honest: every finding that names a flag cites evidence, and diagnose's `enough_data` agrees with the amount of
  load lines the expert counted (not enough data -> fewer than `LITTLE_DATA`; enough -> at least `MIN_LINES`).

Regenerate the committed scores: `python -m tests.diagnose.test_real_logs --write-scores`.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from toolkit.diagnose import Diagnosis, analyze
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.rules.context import MIN_LINES

CORPUS = Path(__file__).parent / "real_logs"
SCORES = CORPUS / "scores.json"
CHECKS = ("reading", "advice", "quiet", "honest")
MIN_FILES = 60
LITTLE_DATA = 2 * MIN_LINES  # "little data": fewer load lines than this
ALIASES = {"vllm_stats": "stats", "crash": "exception"}
ALWAYS_SCORED = ("decode", "prefill", "stats", "retract", "preempt", "oom", "leak", "exception", "sigquit",
                 "watchdog", "not_enough_memory", "spec_metrics", "kv_transfer_failed")
LOAD_KINDS = ("decode", "stats")
LOUD = ("warning", "critical")
SIDECAR_KEYS = {"engine", "version", "kind", "events", "advice", "nothing_to_advise", "notes"}
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")


@dataclass(frozen=True, slots=True)
class Score:
    """One file's result: True/False per check, None where the check does not apply."""

    name: str
    group: str
    kind: str
    checks: Mapping[str, bool | None]


def corpus_files() -> list[Path]:
    """Every excerpt of the corpus, in name order."""
    return sorted(CORPUS.glob("*/*.log"))


def sidecar(log: Path) -> dict[str, Any]:
    return json.loads(log.with_suffix(".expect.json").read_text())


def expected_counts(expect: Mapping[str, Any]) -> dict[str, int]:
    """The sidecar's event counts under diagnose's kind names."""
    return {ALIASES.get(kind, kind): int(n) for kind, n in expect["events"].items()}


def finding_flags(f: Finding) -> set[str]:
    """The flags a finding advises: its `flag`, and every `--flag` its `suggested` text names."""
    flags = {f.flag} if f.flag and f.flag.startswith("--") else set()
    return flags | set(_FLAG.findall(f.suggested or ""))


def reading(d: Diagnosis, expect: Mapping[str, Any]) -> bool:
    expected = expected_counts(expect)
    kinds = set(ALWAYS_SCORED) | set(expected)
    return all(int(d.stats.kinds.get(k, 0)) == expected.get(k, 0) for k in kinds)


def advice(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    wanted = set(expect["advice"])
    if not wanted:
        return None
    given = set().union(*(finding_flags(f) for f in d.findings)) if d.findings else set()
    return wanted <= given


def quiet(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    if not expect["nothing_to_advise"]:
        return None
    return not any(f.severity in LOUD for f in d.findings)


def honest(d: Diagnosis, expect: Mapping[str, Any]) -> bool:
    """No advice without evidence, and no claim about the amount of data the expert would not make."""
    cited = all(f.evidence.count > 0 or f.evidence.lines for f in d.findings if finding_flags(f))
    load = sum(expected_counts(expect).get(k, 0) for k in LOAD_KINDS)
    agrees = load >= MIN_LINES if d.enough_data else load < LITTLE_DATA
    return cited and agrees


def score_file(log: Path) -> Score:
    expect = sidecar(log)
    d = analyze([log])
    checks = {"reading": reading(d, expect), "advice": advice(d, expect), "quiet": quiet(d, expect),
              "honest": honest(d, expect)}
    return Score(f"{log.parent.name}/{log.stem}", log.parent.name, str(expect["kind"]), checks)


@lru_cache(maxsize=1)
def score_corpus() -> tuple[Score, ...]:
    return tuple(score_file(log) for log in corpus_files())


# -- tables and the committed scores ------------------------------------------------------------------------------

def tally(scores: Iterable[Score], check: str) -> tuple[int, int]:
    """(passed, applicable) of one check."""
    results = [s.checks[check] for s in scores if s.checks[check] is not None]
    return sum(bool(r) for r in results), len(results)


def _cell(passed: int, of: int) -> str:
    return f"{passed}/{of}" if of else "-"


def table(scores: tuple[Score, ...]) -> str:
    """A markdown table by engine folder and kind, then per engine folder, then the total."""
    rows = ["| engine | kind | files | " + " | ".join(CHECKS) + " |", "|---|---|---:|" + "---:|" * len(CHECKS)]
    groups = sorted({(s.group, s.kind) for s in scores})
    for group, kind in groups:
        rows.append(_row(group, kind, [s for s in scores if (s.group, s.kind) == (group, kind)]))
    for group in sorted({s.group for s in scores}):
        rows.append(_row(f"**{group}**", "all", [s for s in scores if s.group == group]))
    rows.append(_row("**total**", "", list(scores)))
    return "\n".join(rows)


def _row(group: str, kind: str, scores: list[Score]) -> str:
    cells = [_cell(*tally(scores, check)) for check in CHECKS]
    return f"| {group} | {kind} | {len(scores)} | " + " | ".join(cells) + " |"


def as_json(scores: tuple[Score, ...]) -> dict[str, Any]:
    totals = {check: dict(zip(("passed", "of"), tally(scores, check))) for check in CHECKS}
    files = {s.name: {c: v for c, v in s.checks.items() if v is not None} for s in scores}
    return {"totals": totals, "files": files}


def drops_and_rises(now: Mapping[str, Any], committed: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """What fell below the committed scores (a total, or a file's check that passed), and what rose."""
    drops, rises = [], []
    for check in CHECKS:
        was, new = committed["totals"][check]["passed"], now["totals"][check]["passed"]
        (drops if new < was else rises if new > was else []).append(f"{check}: {was} -> {new} passed")
    for name, checks in committed["files"].items():
        for check, passed in checks.items():
            new = now["files"].get(name, {}).get(check)
            if passed and not new:
                drops.append(f"{name}: {check} no longer passes")
            elif not passed and new:
                rises.append(f"{name}: {check} now passes")
    return drops, rises


# -- tests --------------------------------------------------------------------------------------------------------

def test_every_excerpt_names_its_source_and_has_a_sidecar() -> None:
    logs = corpus_files()
    assert len(logs) >= MIN_FILES
    for log in logs:
        header = [line for line in log.read_text().splitlines() if line.startswith("# ")]
        assert any(line.startswith("# url: https://github.com/") for line in header), log
        assert any(line.startswith("# source: ") for line in header), log
        expect = sidecar(log)
        assert SIDECAR_KEYS <= set(expect), log
        assert not (expect["nothing_to_advise"] and expect["advice"]), log


def test_real_log_scores_do_not_drop(capsys: pytest.CaptureFixture[str]) -> None:
    scores = score_corpus()
    now = as_json(scores)
    committed = json.loads(SCORES.read_text())
    drops, rises = drops_and_rises(now, committed)
    with capsys.disabled():
        print(f"\nreal-log corpus ({len(scores)} files):\n{table(scores)}")
        for rise in rises:
            print(f"note: score rose ({rise}); update {SCORES.name} with --write-scores")
    assert not drops, "scores dropped below the committed ones:\n" + "\n".join(drops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score the real-log corpus.")
    parser.add_argument("--write-scores", action="store_true", help=f"write today's scores to {SCORES}")
    args = parser.parse_args(argv)
    scores = score_corpus()
    print(table(scores))
    if args.write_scores:
        SCORES.write_text(json.dumps(as_json(scores), indent=1, sort_keys=True) + "\n")
        print(f"wrote {SCORES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

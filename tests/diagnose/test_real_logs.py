"""The real-log corpus (tests/diagnose/real_logs/): excerpts of SGLang and vLLM logs quoted from public GitHub issues,
and whole logs of real engines recorded on a CPU under known mistunings (real_logs/recorded/), each with a sidecar
of what an expert reads in it (written from reading the log, never from diagnose's output). Every run scores the
whole corpus, prints the table and the running first-contact totals (real_logs/first_contact.json: each batch's
score before any rule was written for it), and fails on any drop from the committed scores (real_logs/scores.json).
Each check can fail both ways:

- reading: the events diagnose reads equal the sidecar's counts, for every kind the sidecar names and for the load
  and error kinds (`ALWAYS_SCORED`, 0 when the sidecar does not name them);
- advice: every entry of the sidecar's `advice` is among the flags of diagnose's findings (an entry `a|b` is met by
  either), and where the sidecar gives a `direction` (raise / lower) a finding moves that flag that way;
- precise: no warning or critical finding names a flag where the sidecar says no flag helps (`no_flag_helps`), and
  none names a flag only the other engine has (files where diagnose advises a flag loudly);
- quiet: no warning or critical finding, and no info finding naming a flag (files with `nothing_to_advise`);
- verdict: diagnose's verdict equals the expert's: `crash` (a critical crash finding), `problem` (another warning or
  critical finding) or `healthy` (neither). The sidecar's `verdict`, or where an older sidecar has none, its kind
  (`VERDICT_OF_KIND`); files with neither are not judged.

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
from toolkit.diagnose.vocabulary import ENGINES, KNOBS

CORPUS = Path(__file__).parent / "real_logs"
SCORES = CORPUS / "scores.json"
FIRST_CONTACT = CORPUS / "first_contact.json"
RECORDED = CORPUS / "recorded"
RECORDER = "benchmarks/record_engine_logs.py"
CHECKS = ("reading", "advice", "precise", "quiet", "verdict")
MIN_FILES = 60
VERDICTS = ("healthy", "problem", "crash")
VERDICT_OF_KIND = {"healthy": "healthy", "idle": "healthy", "crash": "crash", "startup-crash": "crash",
                   "decode-oom-crash": "crash"}
DIRECTIONS = {"raise": 1, "lower": -1}
ALIASES = {"vllm_stats": "stats", "crash": "exception"}
ALWAYS_SCORED = ("decode", "prefill", "stats", "retract", "preempt", "oom", "leak", "exception", "sigquit",
                 "watchdog", "not_enough_memory", "spec_metrics", "kv_transfer_failed")
LOUD = ("warning", "critical")
SIDECAR_KEYS = {"engine", "version", "kind", "events", "advice", "nothing_to_advise", "notes"}
OPTIONAL_KEYS = {"direction", "verdict"}
_FLAG = re.compile(r"--[a-z][a-z0-9-]*")
CLIENT_ACTION = "client:"  # an action for the client, not the server


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
    """The server flags a finding advises: its `flag`, and every `--flag` its `suggested` text names, except in an
    action for the client (`client: raise the request rate / --max-concurrency`: a benchmark's flag, not the
    server's)."""
    flags = {f.flag} if f.flag and f.flag.startswith("--") else set()
    if f.change is None and (f.action or "").startswith(CLIENT_ACTION):
        return flags
    return flags | set(_FLAG.findall(f.suggested or ""))


def reading(d: Diagnosis, expect: Mapping[str, Any]) -> bool:
    expected = expected_counts(expect)
    kinds = set(ALWAYS_SCORED) | set(expected)
    return all(int(d.stats.kinds.get(k, 0)) == expected.get(k, 0) for k in kinds)


def given_flags(findings: Iterable[Finding]) -> set[str]:
    return set().union(*(finding_flags(f) for f in findings))


def moves(f: Finding, flag: str) -> set[int]:
    """The ways (+1 up, -1 down) a finding moves `flag`: its change against the value now, or the direction it
    says; its alternatives by their direction."""
    engine = f.engine
    changes = ([f.change] if f.change else []) + list(f.alternatives)
    ways = {c.direction for c in changes if c.direction and c.as_flag(engine).split()[0] == flag}
    if f.change and f.flag == flag and not f.change.direction:
        now = f.current.value if f.current is not None else None
        to = _number(f.change.value)
        if to is not None and isinstance(now, (int, float)) and not isinstance(now, bool) and to != now:
            ways.add(1 if to > now else -1)
    return ways


def _number(value: object) -> float | None:
    try:
        return float(value) if isinstance(value, str) else None
    except ValueError:
        return None


def advice(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    """Every advised flag (an entry `a|b`: either) named, each moved the sidecar's way where it gives one."""
    wanted = [entry.split("|") for entry in expect["advice"]]
    if not wanted:
        return None
    given = given_flags(d.findings)
    met = [next((flag for flag in options if flag in given), None) for options in wanted]
    if None in met:
        return False
    directions = expect.get("direction", {})
    return all(DIRECTIONS[directions[flag]] in set().union(*(moves(f, flag) for f in d.findings))
               for flag in met if flag in directions)


def engine_flags(engine: str) -> set[str]:
    return {k.flag for k in KNOBS.get(engine, ())}  # type: ignore[call-overload]


def foreign_flags(engine: str) -> set[str]:
    """Flags only the other engine has (empty for an engine neither table knows)."""
    if engine not in ENGINES:
        return set()
    others = set().union(*(engine_flags(e) for e in ENGINES if e != engine))
    return others - engine_flags(engine)


def precise(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    """No loud advice where no flag helps, nor in the other engine's flags; None where none is given loudly."""
    loud = given_flags(f for f in d.findings if f.severity in LOUD)
    if not loud:
        return None
    return not no_flag_helps(expect) and not loud & foreign_flags(str(expect["engine"]))


def no_flag_helps(expect: Mapping[str, Any]) -> bool:
    """The expert says no flag helps: a server with nothing wrong, or a sidecar that states its verdict (recorded
    logs) and advises nothing (a crash, an overload only more replicas serve). An older sidecar's empty advice may
    mean the excerpt is too short to say."""
    return bool(expect["nothing_to_advise"] or ("verdict" in expect and not expect["advice"]))


def quiet(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    if not expect["nothing_to_advise"]:
        return None
    return not any(f.severity in LOUD or finding_flags(f) for f in d.findings)


def diagnosed_verdict(d: Diagnosis) -> str:
    if any(f.rule == "crash" and f.severity == "critical" for f in d.findings):
        return "crash"
    return "problem" if any(f.severity in LOUD for f in d.findings) else "healthy"


def expected_verdict(expect: Mapping[str, Any]) -> str | None:
    return expect.get("verdict") or VERDICT_OF_KIND.get(str(expect["kind"]))


def verdict(d: Diagnosis, expect: Mapping[str, Any]) -> bool | None:
    wanted = expected_verdict(expect)
    return None if wanted is None else diagnosed_verdict(d) == wanted


def score_file(log: Path) -> Score:
    expect = sidecar(log)
    d = analyze([log])
    checks = {"reading": reading(d, expect), "advice": advice(d, expect), "precise": precise(d, expect),
              "quiet": quiet(d, expect), "verdict": verdict(d, expect)}
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

def test_every_log_names_its_source_and_has_a_sidecar() -> None:
    """An excerpt names the thread it quotes; a recorded log, the script that recorded it (and its situation)."""
    logs = corpus_files()
    assert len(logs) >= MIN_FILES
    for log in logs:
        header = [line for line in log.read_text().splitlines() if line.startswith("# ")]
        source = "# source: recorded by " + RECORDER if log.parent == RECORDED else "# url: https://github.com/"
        assert any(line.startswith(source) for line in header), log
        assert any(line.startswith("# source: ") for line in header), log
        expect = sidecar(log)
        assert SIDECAR_KEYS <= set(expect) <= SIDECAR_KEYS | OPTIONAL_KEYS, log
        assert not (expect["nothing_to_advise"] and expect["advice"]), log
        assert expect.get("verdict", VERDICTS[0]) in VERDICTS, log
        flags = {flag for entry in expect["advice"] for flag in entry.split("|")}
        assert set(expect.get("direction", {})) <= flags, log
        assert set(expect.get("direction", {}).values()) <= set(DIRECTIONS), log


def first_contact_totals(batches: list[Mapping[str, Any]]) -> str:
    """The running first-contact totals: per check, passed of applicable over every batch that states it."""
    parts = []
    for check in CHECKS:
        stated = [b[check] for b in batches if check in b]
        if stated:
            passed, of = sum(p for p, _ in stated), sum(n for _, n in stated)
            share = f" ({100 * passed / of:.0f} %)" if of else ""
            parts.append(f"{check} {passed}/{of}{share} in {len(stated)} batches")
    return f"first contact ({len(batches)} batches, before their rules): " + "; ".join(parts)


def first_contact_row(name: str, day: str, logs: list[Path]) -> dict[str, Any]:
    """A new batch's first-contact score: run before any change to diagnose for it, and committed with it."""
    scores = [score_file(log) for log in logs]
    return {"batch": name, "date": day, "files": len(scores),
            **{check: list(tally(scores, check)) for check in CHECKS},
            "per_file": {s.name: {c: v for c, v in s.checks.items() if v is not None} for s in scores}}


def recorded_table(logs: list[Path]) -> str:
    """Markdown: per recorded log, the expert's verdict and advice against diagnose's verdict and loud findings."""
    rows = ["| situation | expert: verdict, advice | diagnose: verdict | findings (warning/critical; info naming a flag) "
            "| checks failed |", "|---|---|---|---|---|"]
    for log in logs:
        expect, d = sidecar(log), analyze([log])
        shown = [f"{f.id} {f.flag or ''} {f.suggested or ''}".strip() for f in d.findings
                 if f.severity in LOUD or finding_flags(f)]
        failed = [c for c, ok in score_file(log).checks.items() if ok is False]
        advice = ", ".join(expect["advice"]) or "none"
        rows.append(f"| {log.stem} | {expected_verdict(expect)}, {advice} | {diagnosed_verdict(d)} | "
                    f"{'; '.join(shown) or '-'} | {', '.join(failed) or '-'} |")
    return "\n".join(rows)


def test_first_contact_scores_are_recorded_for_every_batch() -> None:
    batches = json.loads(FIRST_CONTACT.read_text())["batches"]
    recorded = {name for b in batches for name in b.get("per_file", {})}
    missing = [f"recorded/{log.stem}" for log in sorted(RECORDED.glob("*.log")) if f"recorded/{log.stem}" not in recorded]
    assert not missing, f"recorded logs without a first-contact score (score them before changing diagnose): {missing}"
    for b in batches:
        assert all(0 <= b[c][0] <= b[c][1] for c in CHECKS if c in b), b["batch"]


def test_real_log_scores_do_not_drop(capsys: pytest.CaptureFixture[str]) -> None:
    scores = score_corpus()
    now = as_json(scores)
    committed = json.loads(SCORES.read_text())
    drops, rises = drops_and_rises(now, committed)
    with capsys.disabled():
        print(f"\nreal-log corpus ({len(scores)} files):\n{table(scores)}")
        print(first_contact_totals(json.loads(FIRST_CONTACT.read_text())["batches"]))
        for rise in rises:
            print(f"note: score rose ({rise}); update {SCORES.name} with --write-scores")
    assert not drops, "scores dropped below the committed ones:\n" + "\n".join(drops)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Score the real-log corpus.")
    parser.add_argument("--write-scores", action="store_true", help=f"write today's scores to {SCORES}")
    parser.add_argument("--first-contact", metavar="BATCH", help=f"score the --files as a new batch, before any "
                        f"change to diagnose for them, and add the row to {FIRST_CONTACT.name}")
    parser.add_argument("--files", nargs="*", type=Path, default=[], help="the new batch's logs")
    parser.add_argument("--date", default=None, help="the batch's date (default: today)")
    parser.add_argument("--recorded-table", action="store_true", help="print the recorded logs' table: situation, "
                        "the expert's verdict and advice, diagnose's verdict and findings, the checks")
    args = parser.parse_args(argv)
    if args.recorded_table:
        print(recorded_table(sorted(RECORDED.glob("*.log"))))
        return 0
    if args.first_contact:
        from datetime import date

        row = first_contact_row(args.first_contact, args.date or date.today().isoformat(), sorted(args.files))
        data = json.loads(FIRST_CONTACT.read_text())
        data["batches"] = [b for b in data["batches"] if b["batch"] != row["batch"]] + [row]
        FIRST_CONTACT.write_text(json.dumps(data, indent=1) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "per_file"}))
        print(first_contact_totals(data["batches"]))
        return 0
    scores = score_corpus()
    print(table(scores))
    if args.write_scores:
        SCORES.write_text(json.dumps(as_json(scores), indent=1, sort_keys=True) + "\n")
        print(f"wrote {SCORES}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tuning loop's logic, free of I/O: measure the start, then repeatedly take the most severe actionable finding
of the best configuration so far, apply its flag change, measure, and keep the change only if the objective
improved beyond the noise (`tune.objective`); otherwise revert it and mark the finding tried.

A configuration is measured by a `Measure` callable (launch, run the workload R times, stop, diagnose: see
`tune.experiment`), so the loop runs in milliseconds against a fake. It stops when nothing actionable is left,
when `max_steps` experiments or `max_time` seconds are spent, or on Ctrl-C (the best so far is kept). A step
whose launch or run fails is reverted and the loop goes on.

Push-until-it-breaks knobs (the ideas that move by `push` in diagnose's table: `--mem-fraction-static`, vLLM's
`--gpu-memory-utilization`): the guide raises them in
small increments until the server runs out of memory. Here each try moves the knob from the best value by
`step * 2**k` (k = tries so far in that direction since the last kept change; a step below the noise is followed
by a bigger one), never past the advice's own value, never to or past a value whose launch failed, at most
`PUSH_TRIES` tries. Any other numeric knob advised only "higher" or "lower" (no value: the finding could not size
it) is doubled or halved from its value now; a finding tried once is not tried again.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from toolkit.diagnose.findings import rank_of
from toolkit.diagnose.findings import Current
from toolkit.diagnose.vocabulary import ENGINES, IDEAS, Engine, knob
from toolkit.tune.flags import Advice, FlagChange, Flags, Proposal, Value, numeric, propose
from toolkit.tune.objective import Comparison, NoiseRule, Sample, compare, sample_of

Status = Literal["baseline", "kept", "reverted", "failed", "interrupted"]


class PushRule(NamedTuple):
    step: float
    low: float
    high: float


MEMORY_FRACTION_PUSH = PushRule(0.01, 0.05, 0.99)
PUSH_KNOBS = {found.flag: MEMORY_FRACTION_PUSH for idea in IDEAS.values() if idea.move == "push"
              for engine in ENGINES if (found := knob(idea.name, engine)) is not None}
PUSH_TRIES = 4
SCALE = 2.0  # "higher"/"lower" without a value, on a knob that is not pushed: double or halve the value now


@dataclass(frozen=True, slots=True)
class Trial:
    """One configuration measured: the objective per repeat, what diagnose found, or why it failed."""

    values: tuple[float, ...] = ()
    findings: tuple[Advice, ...] = ()
    records: tuple[dict, ...] = ()
    verdict: str | None = None
    error: str | None = None
    folder: str | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.values)

    @property
    def sample(self) -> Sample:
        return sample_of(self.values)


class Measure(Protocol):
    def __call__(self, flags: Flags, index: int) -> Trial:
        """Launch with `flags`, run the workload, stop, diagnose. Raises KeyboardInterrupt on Ctrl-C, after
        stopping the server."""


@dataclass(frozen=True, slots=True)
class Settings:
    engine: Engine = "sglang"
    noise: NoiseRule = NoiseRule()
    max_steps: int = 8
    max_time: float | None = None
    knobs: frozenset[str] | None = None  # the tuning ideas (diagnose/vocabulary.py) it may move; None: every one
    objective: str = "throughput"

    def may_move(self, advice: Advice) -> bool:
        change = advice.change
        if advice.serves == "latency" and self.objective == "throughput":
            return False  # NOTE: it trades throughput away by design (a smaller chunk): measured -16 % in tune_vs_search
        if self.knobs is None or change is None:
            return True
        return change.idea in self.knobs and all(c.idea in self.knobs for c in change.companions)


@dataclass(frozen=True, slots=True)
class Step:
    index: int
    flags: Flags
    trial: Trial
    status: Status
    change: FlagChange | None = None
    finding: Advice | None = None
    comparison: Comparison | None = None
    against: int | None = None  # the step it was compared with (and changed)
    base: Flags | None = None  # that step's flags
    started: float = 0.0

    @property
    def sample(self) -> Sample:
        return self.trial.sample


@dataclass(slots=True)
class Result:
    steps: list[Step] = field(default_factory=list)
    best: Step | None = None
    reason: str = ""
    seconds: float = 0.0

    @property
    def start(self) -> Step | None:
        return self.steps[0] if self.steps and self.steps[0].status == "baseline" else None


class Push(NamedTuple):
    """One try of a push knob: which knob, which way, to what value."""

    flag: str
    direction: int
    value: float


class Plan(NamedTuple):
    """A finding's change, the key that marks it tried, and the push it is (None for a plain change)."""

    change: FlagChange
    key: tuple
    push: Push | None = None


class Candidate(NamedTuple):
    flags: Flags
    finding: Advice
    plan: Plan


@dataclass(slots=True)
class _Memory:
    """What the loop has learned: configurations measured, findings tried, and each push knob's history."""

    measured: set = field(default_factory=set)
    tried: set = field(default_factory=set)
    pushes: dict[tuple[str, int], int] = field(default_factory=dict)  # (flag, direction) -> tries since a keep
    broken: dict[str, list[float]] = field(default_factory=dict)  # flag -> values whose launch failed


def ranked(findings: Sequence[Advice]) -> list[Advice]:
    """Most severe first; the diagnosis's own order within a severity."""
    return sorted(findings, key=lambda f: -rank_of(f.severity))


def _push(proposal: Proposal, advice: Advice, flags: Flags, memory: _Memory) -> Push | None:
    rule = PUSH_KNOBS[proposal.flag]
    current = numeric(flags.get(proposal.flag))
    current = numeric(advice.current.value if advice.current else None) if current is None else current
    target = numeric(proposal.value)
    if current is None:
        return Push(proposal.flag, 0, target) if target is not None else None
    direction = proposal.direction or (1 if target is not None and target > current else -1)
    tries = memory.pushes.get((proposal.flag, direction), 0)
    if tries >= PUSH_TRIES:
        return None
    value = current + direction * rule.step * 2 ** tries
    if target is not None:
        value = min(value, target) if direction > 0 else max(value, target)
    value = round(min(rule.high, max(rule.low, value)), 4)
    broken = memory.broken.get(proposal.flag, [])
    if value == current or any((value - b) * direction >= 0 for b in broken):
        return None
    return Push(proposal.flag, direction, value)


def _scaled(proposal: Proposal, advice: Advice, flags: Flags, memory: _Memory, integer: bool) -> str | None:
    """A "higher"/"lower" without a value, for a knob that is not pushed: the value now doubled or halved (an
    integer knob stays an integer, at least 1); None where the value now is unknown, or the new one is no change or
    at or past a value whose launch failed."""
    current = numeric(flags.get(proposal.flag))
    current = numeric(advice.current.value if advice.current else None) if current is None else current
    if current is None or current <= 0:
        return None
    value = current * SCALE ** proposal.direction
    value = max(1.0, float(round(value))) if integer else round(value, 4)
    broken = memory.broken.get(proposal.flag, [])
    if value == current or any((value - b) * proposal.direction >= 0 for b in broken):
        return None
    return f"{value:.0f}" if integer else f"{value:g}"


def plan_for(advice: Advice, flags: Flags, engine: Engine, memory: _Memory) -> Plan | None:
    """The change this finding asks of `flags`; None when it is not actionable."""
    proposal = propose(advice, engine)
    if proposal is None:
        return None
    if proposal.flag in PUSH_KNOBS:
        push = _push(proposal, advice, flags, memory)
        if push is None:
            return None
        change = FlagChange(proposal.flag, f"{push.value:g}", proposal.companions)
        return Plan(change, (advice.id, proposal.flag, push.direction, push.value), push)
    if proposal.direction:
        value = _scaled(proposal, advice, flags, memory, knob(advice.change.idea, engine).kind == "int")
        if value is None:
            return None
        change = FlagChange(proposal.flag, value, proposal.companions)
        return Plan(change, (advice.id, proposal.flag, value))
    change = FlagChange(proposal.flag, proposal.value, proposal.companions)
    if change.apply(flags).key == flags.key or (_runs_with(proposal.value, advice.current)
                                                and flags.get(proposal.flag) is None):
        return None
    return Plan(change, (advice.id, proposal.flag, proposal.value))


def _runs_with(value: Value | None, now: Current | None) -> bool:
    """Whether the server runs with `value` already (the finding's current value; a number as a number)."""
    if now is None or now.value is None or value is None or isinstance(value, bool) or isinstance(now.value, bool):
        return False
    number, current = numeric(value), numeric(now.value)
    return number == current if number is not None and current is not None else value == now.value


class Tuner:
    def __init__(self, measure: Measure, settings: Settings = Settings(),
                 on_step: Callable[[Step, Step], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """`on_step(step, best)` sees every step as soon as it is judged."""
        self.measure = measure
        self.settings = settings
        self.on_step = on_step or (lambda step, best: None)
        self.clock = clock
        self.memory = _Memory()

    def run(self, start: Flags) -> Result:
        result = Result()
        began = self.clock()
        try:
            self._run(start, result, began)
        except KeyboardInterrupt:
            result.reason = "stopped by Ctrl-C"
        result.seconds = self.clock() - began
        return result

    def _run(self, start: Flags, result: Result, began: float) -> None:
        first = self._measure(start, result, began)
        base = self._judged(first, "baseline" if first.trial.ok else "failed")
        result.steps.append(base)
        self.on_step(base, base)
        if base.status == "failed":
            result.reason = f"the starting configuration failed: {base.trial.error or 'nothing was measured'}"
            return
        result.best = base
        while True:
            reason = self._spent(result, began)
            candidate = None if reason else self.next_candidate(result.best)
            if reason or candidate is None:
                result.reason = reason or self._nothing_left(result)
                return
            step = self._try(candidate, result, began)
            result.steps.append(step)
            if step.status == "kept":
                result.best = step
                self.memory.pushes = {k: 0 for k in self.memory.pushes}
            self.on_step(step, result.best)

    def next_candidate(self, best: Step) -> Candidate | None:
        for advice in ranked(best.trial.findings):
            if not self.settings.may_move(advice):
                continue
            plan = plan_for(advice, best.flags, self.settings.engine, self.memory)
            if plan is None:
                continue
            flags = plan.change.apply(best.flags)
            if plan.key in self.memory.tried or flags.key in self.memory.measured:
                continue
            return Candidate(flags, advice, plan)
        return None

    def _measure(self, flags: Flags, result: Result, began: float) -> Step:
        self.memory.measured.add(flags.key)
        started = self.clock() - began
        return Step(len(result.steps), flags, self.measure(flags, len(result.steps)), "baseline", started=started)

    def _judged(self, step: Step, status: Status, **changes) -> Step:
        return Step(step.index, step.flags, step.trial, status, started=step.started, **changes)

    def _try(self, candidate: Candidate, result: Result, began: float) -> Step:
        best = result.best
        try:
            step = self._measure(candidate.flags, result, began)
        except KeyboardInterrupt:
            interrupted = Step(len(result.steps), candidate.flags, Trial(error="stopped by Ctrl-C"), "interrupted",
                               candidate.plan.change, candidate.finding, against=best.index, base=best.flags,
                               started=self.clock() - began)
            result.steps.append(interrupted)
            self.on_step(interrupted, best)
            raise
        context = dict(change=candidate.plan.change, finding=candidate.finding, against=best.index, base=best.flags)
        if not step.trial.ok:
            self._forget(candidate, failed=True)
            return self._judged(step, "failed", **context)
        comparison = compare(best.sample, step.sample, self.settings.noise)
        if comparison.better:
            return self._judged(step, "kept", comparison=comparison, **context)
        self._forget(candidate, failed=False)
        return self._judged(step, "reverted", comparison=comparison, **context)

    def _forget(self, candidate: Candidate, failed: bool) -> None:
        """Marks the finding's change tried; a push knob remembers the try, and a failed launch as its edge."""
        self.memory.tried.add(candidate.plan.key)
        push = candidate.plan.push
        if push is not None:
            way = (push.flag, push.direction)
            self.memory.pushes[way] = self.memory.pushes.get(way, 0) + 1
            if failed:
                self.memory.broken.setdefault(push.flag, []).append(push.value)

    def _spent(self, result: Result, began: float) -> str | None:
        experiments = len(result.steps) - 1
        if experiments >= self.settings.max_steps:
            n = self.settings.max_steps
            return f"the step budget is spent ({n} step{'' if n == 1 else 's'})"
        limit = self.settings.max_time
        if limit is not None:
            elapsed = self.clock() - began
            typical = max(s.trial.seconds for s in result.steps)
            if elapsed + typical > limit:
                return (f"the time budget is spent ({elapsed:.0f} s of {limit:.0f} s used; a step takes about "
                        f"{typical:.0f} s)")
        return None

    def _nothing_left(self, result: Result) -> str:
        experiments = result.steps[1:]
        if not experiments:
            return "nothing actionable: the diagnosis asks for no flag change this server accepts"
        if not any(s.status == "kept" for s in experiments):
            return "nothing helped: every change the diagnosis asked for was reverted"
        return "nothing actionable is left"

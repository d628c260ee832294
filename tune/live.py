"""The terminal view of a tuning run: a live table (step, change, objective mean ± spread, delta, the finding that
drove it, kept/reverted) with a status line under it; on a non-terminal, one line per event instead."""
from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from toolkit.tune.loop import Step
from toolkit.tune.objective import UNITS

STYLE = {"baseline": "bold", "kept": "bold green", "reverted": "yellow", "failed": "red", "interrupted": "magenta"}


def objective_text(step: Step) -> str:
    sample = step.sample
    if not sample.n:
        return "-"
    return f"{sample.mean:,.1f} ± {sample.spread:,.1f}"


def delta_text(step: Step) -> str:
    c = step.comparison
    if c is None:
        return "-"
    return f"{c.delta:+,.1f} ({c.relative:+.0%}) vs #{step.against}, needs > {c.threshold:,.1f}"


def change_text(step: Step) -> str:
    if step.change is None or step.base is None:
        return f"start: {step.flags.text() or '(server defaults)'}"
    return step.change.describe(step.base)


def finding_text(step: Step) -> str:
    f = step.finding
    return f"{f.severity}: {f.title} [{f.id}]" if f is not None else "-"


def result_text(step: Step) -> str:
    return step.trial.error if step.status in ("failed", "interrupted") and step.trial.error else step.status


class LiveView:
    def __init__(self, console: Console, objective: str):
        self.console = console
        self.objective = objective
        self.steps: list[Step] = []
        self.status = ""
        self._live: Live | None = None

    def table(self) -> Table:
        unit = UNITS[self.objective]
        table = Table(title=f"toolkit tune · objective: {self.objective} ({unit})", title_justify="left")
        for name, justify in (("#", "right"), ("change", "left"), (f"{self.objective} mean ± sd", "right"),
                              ("delta", "right"), ("finding that drove it", "left"), ("result", "left"),
                              ("s", "right")):
            table.add_column(name, justify=justify, overflow="fold")
        for step in self.steps:
            style = STYLE.get(step.status, "")
            table.add_row(str(step.index), escape(change_text(step)), objective_text(step), delta_text(step),
                          escape(finding_text(step)), Text(result_text(step), style=style),
                          f"{step.trial.seconds:.0f}")
        return table

    def render(self) -> Group:
        return Group(self.table(), Text(self.status, style="dim"))

    def __enter__(self) -> LiveView:
        if self.console.is_terminal:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4, transient=True)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        self.console.print(self.table())

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self.render(), refresh=True)

    def activity(self, index: int, what: str) -> None:
        self.status = f"step {index}: {what}…"
        if self._live is None:
            self.console.print(self.status, style="dim", highlight=False)
        self._refresh()

    def step(self, step: Step, best: Step) -> None:
        self.steps.append(step)
        self.status = f"step {step.index}: {step.status}; best so far: step {best.index} ({objective_text(best)})"
        if self._live is None:
            self.console.print(
                f"step {step.index} {result_text(step)}: {change_text(step)} · {objective_text(step)} "
                f"{UNITS[self.objective]} · {delta_text(step)} · {finding_text(step)}", highlight=False)
        self._refresh()

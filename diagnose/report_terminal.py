"""The terminal report: verdict first, findings by severity with their advice, then the evidence."""
from __future__ import annotations


from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from toolkit.diagnose.analysis import Diagnosis
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.prefix import clock_text

STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan", "ok": "green", "insufficient": "magenta"}
# control characters (all but tab and newline) as `\\xNN`
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))}


def safe(text: object) -> str:
    """Log-derived text for a terminal: control characters shown as `\\xNN`, never interpreted."""
    return str(text).translate(_CONTROL)


def _evidence(f: Finding) -> Text:
    ev = f.evidence
    parts = [f"evidence: {ev.count} of {ev.total} lines ({ev.fraction:.0%})" if ev.total
             else f"evidence: {ev.count} record{'s' if ev.count != 1 else ''}"]
    if ev.span:
        parts.append(f"from {clock_text(ev.span[0])} to {clock_text(ev.span[1])} ({ev.seconds:.0f} s)")
    if f.ranks:
        parts.append(f"on {len(f.ranks)} rank{'s' if len(f.ranks) != 1 else ''}")
    if ev.lines:
        parts.append("at lines " + ", ".join(map(str, ev.lines[:8])) + (" ..." if len(ev.lines) > 8 else ""))
    facts = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.facts.items()
                      if v is not None)
    confidence = f"; confidence: {f.confidence}"
    return Text(safe(" ".join(parts) + (f"; {facts}" if facts else "") + confidence), style="dim")


def finding_panel(f: Finding) -> Panel:
    body = [Text(safe(f.message))]
    advice = f.advice()
    if advice is not None:
        kind, text = advice
        now = f"   (now: {f.current})" if kind == "change" and f.current else ""
        body.append(Text(safe(f"{kind}: {text}{now}"), style="bold"))
    if f.tradeoff:
        body.append(Text(safe(f"trade-off: {f.tradeoff}"), style="italic"))
    body.append(_evidence(f))
    title = Text(f"{f.severity.upper()}  {safe(f.title)}  [{f.id}]", style=STYLE[f.severity])
    return Panel(Group(*body), title=title, title_align="left", border_style=STYLE[f.severity])


def _config(d: Diagnosis) -> Table:
    table = Table(title="Server (from the log)", show_header=False, box=None, title_justify="left")
    rows = d.config.summary()
    for k, v in rows.items():
        if v is not None:
            table.add_row(k, Text(safe(v)))
    return table


def _parsing(d: Diagnosis) -> Table:
    table = Table(title="What was read", box=None, title_justify="left")
    table.add_column("kind")
    table.add_column("count", justify="right")
    for kind, n in sorted(d.stats.kinds.items(), key=lambda kv: -kv[1]):
        table.add_row(kind, str(n))
    table.add_row("other lines", str(d.stats.other))
    table.add_row("unread lines", str(d.stats.unread), style="red" if d.stats.unread else None)
    return table


def _unjudged(d: Diagnosis) -> Table:
    table = Table(title="Rules that could not judge", box=None, title_justify="left")
    table.add_column("rule")
    table.add_column("why")
    for rule, why in d.unjudged:
        table.add_row(rule, Text(safe(why)))
    return table


def render(d: Diagnosis, console: Console) -> None:
    """Print the report to `console`."""
    console.print(Panel(Text(safe(d.verdict), style=STYLE[d.status]), title="Verdict", title_align="left"))
    for f in d.findings:
        console.print(finding_panel(f))
    if d.command:
        console.print(Text("Corrected launch command:", style="bold"))
        console.print(Text(safe(d.command)), soft_wrap=True)
    for note in d.notes:
        console.print(Text(safe(f"note: {note}"), style="dim"))
    if d.unjudged:
        console.print(_unjudged(d))
    console.print(_config(d))
    console.print(_parsing(d))
    for line, text in d.stats.unread_examples[:5]:
        console.print(Text(safe(f"  unread line {line}: {text[:160]}"), style="dim red"))
    if d.metrics:
        table = Table(title=f"Metrics ({safe(d.metrics.source)})", box=None, title_justify="left")
        for k, v in d.metrics.quoted().items():
            table.add_row(k, f"{v:.4g}")
        console.print(table)

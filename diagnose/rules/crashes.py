"""Crashes and integrity errors: every occurrence is a finding (critical).

- `crash.exception`: `... hit an exception` / tracebacks / vLLM's `EngineCore encountered a fatal error` (not the
  OOMs, memory errors, leaks and graph captures their rules explain: named by the traceback's error line, an
  error record right after it, or, for a traceback cut before its error line, an OOM printed just before it)
  and SGLang's parent's `Received sigquit`, vLLM V0's `MQLLMEngine is already dead` (a request found the engine
  dead: whatever killed it, an OOM its own rule explains included, the server is down); with the workaround to try
  first when the traceback names its cause (`rules.workarounds`). An error printed after a stop was asked for
  (`stop`: a signal received, the HTTP server shutting down) is the teardown's, not a crash: every vLLM V1 log that
  ends with Ctrl-C or SIGTERM may end in the output handler's `EngineDeadError`.
- `crash.stopped` (info): the server was stopped on request and printed errors while it tore down; no flag.
- `crash.watchdog`: a forward pass exceeded `--watchdog-timeout` (default 300 s).
- `crash.leak`: the idle integrity check found KV slots neither free, cached nor in use.
- `crash.graph_capture`: CUDA graph capture failed at start-up (a line of its own, or the error line of the
  scheduler's traceback): a smaller `--cuda-graph-max-bs`, else a lower `--mem-fraction-static` or no graphs.
"""
from __future__ import annotations

from toolkit.diagnose.findings import Current, Finding, evidence_events
from toolkit.diagnose.read.events import Event
from toolkit.diagnose.rules.context import SAME_FAILURE_LINES, Context, no_cache_rows
from toolkit.diagnose.rules.workarounds import workaround
from toolkit.diagnose.vocabulary import Change


CAUSES = ("oom", "not_enough_memory", "leak", "graph_failed")  # errors whose own rules explain the crash


def check(ctx: Context) -> list[Finding]:
    tl, out = ctx.timeline, []
    errors = [e for e in tl.kind("exception") if not _explained(e, ctx)] + tl.kind("sigquit") + tl.kind("engine_dead")
    stopped = _stop_lines(ctx)
    exceptions = [e for e in errors if e.line < stopped.get(e.source, e.line + 1)]
    teardown = [e for e in errors if e.line >= stopped.get(e.source, e.line + 1)]
    if teardown:
        out.append(_stopped(ctx, teardown))
    if exceptions:
        errors = [str(e.fields.get("error", "")) for e in exceptions if e.kind == "exception"]
        dead = any(e.kind == "engine_dead" for e in exceptions)
        last = errors[-1] if errors else "the engine died (its server says so)" if dead else "a child process failed"
        fix = workaround(ctx.config, [e for e in exceptions if e.kind == "exception"])
        advice = "Read the traceback at the quoted line; the scheduler does not recover from it."
        if fix is None:
            out.append(Finding(
                id="crash.exception", severity="critical", title=f"Server crashed ({len(exceptions)} error records)",
                message=f"Last error: {last}", evidence=evidence_events(exceptions, error=last), change=None,
                current=None, tradeoff=advice))
        else:
            out.append(Finding(
                id="crash.exception", severity="critical", title=f"Server crashed ({len(exceptions)} error records)",
                message=f"Last error: {last.rstrip('.')}. {fix.why}",
                evidence=evidence_events(exceptions, error=last, **fix.facts), change=fix.change, current=fix.current,
                tradeoff=f"{fix.tradeoff} {advice}", action=fix.action, alternatives=fix.alternatives))
    watchdog = tl.kind("watchdog")
    if watchdog:
        timeout = watchdog[0].fields.get("watchdog_timeout")
        out.append(Finding(
            id="crash.watchdog", severity="critical", title=f"Watchdog timeout ({len(watchdog)}x)",
            message=f"A forward pass ran longer than the watchdog allows ({timeout} s): the scheduler was stuck "
            "(a hang in NCCL, a kernel, or a huge batch).",
            evidence=evidence_events(watchdog, watchdog_timeout=timeout if isinstance(timeout, (int, float)) else None),
            change=Change("watchdog"),
            current=Current(value=timeout, said=str(timeout)) if timeout is not None else None,
            tradeoff="Raise it only if one forward pass legitimately takes that long; otherwise it hides a hang."))
    leaks = tl.kind("leak")
    if leaks:
        out.append(Finding(
            id="crash.leak", severity="critical", title=f"KV cache leak detected ({len(leaks)}x)",
            message="The idle check found KV slots that are neither free, cached nor owned by a request: a scheduler "
            "bug; memory drains until restart.", evidence=evidence_events(leaks), change=None, current=None,
            tradeoff="Restart to recover; --disable-radix-cache narrows down whether the cache is involved."))
    graph = tl.kind("graph_failed")
    if graph:
        cgmb = ctx.config.cuda_graph_max_bs
        out.append(Finding(
            id="crash.graph_capture", severity="critical", title="CUDA graph capture failed",
            message="Capturing decode graphs ran out of memory or hit an unsupported op: capture fewer batch sizes, or "
            f"leave more memory outside the KV pool (a lower {ctx.config.flag('kv_memory')}).",
            evidence=evidence_events(graph), change=Change("graph_max_bs", str(max(1, (cgmb or 16) // 2))),
            current=Current.of(cgmb) if cgmb else None,
            tradeoff="Fewer captured sizes: larger batches run without graphs; a smaller KV pool holds fewer tokens.",
            alternatives=(Change("kv_memory", direction=-1), Change("graphs_off", True))))
    return out


def _stop_lines(ctx: Context) -> dict[int, int]:
    """Per source, the line where a stop was first asked for."""
    first: dict[int, int] = {}
    for stop in ctx.timeline.kind("stop"):
        first[stop.source] = min(stop.line, first.get(stop.source, stop.line))
    return first


def _stopped(ctx: Context, teardown: list[Event]) -> Finding:
    stop = min(ctx.timeline.kind("stop"), key=lambda e: (e.source, e.line))
    said = str(stop.fields.get("message", "")).strip()
    return Finding(
        id="crash.stopped", severity="info", title="Stopped on request",
        message=f"The server was asked to stop ({said!r}); the {len(teardown)} error record"
        f"{'s' if len(teardown) != 1 else ''} after it came from its teardown, not from serving: not a crash.",
        evidence=evidence_events([stop, *teardown]), change=None, current=None)


def _explained(exception: Event, ctx: Context) -> bool:
    """Whether an error rule explains the exception (on its source and rank): its own error line names the cause
    (the same record); the cause's record starts where the exception's ends (an error line such as
    `torch.OutOfMemoryError: ...` opens a record of its own); or, for a traceback whose error line the log does
    not show (cut off), an OOM message printed just before it is what it raises (SGLang logs `Decode out of
    memory` and then the traceback that ends in it), and so is a start-up line that left no memory for the KV cache."""
    after = exception.last_line + 1
    cut = exception.error.cut
    for kind in CAUSES:
        for cause in ctx.timeline.kind(kind):
            if cause.source != exception.source:
                continue
            if cause.line == exception.line:
                return True
            if cause.rank != exception.rank:
                continue
            if cause.line == after or (cut and kind in ("oom", "not_enough_memory")
                                       and 0 < exception.line - cause.line <= SAME_FAILURE_LINES):
                return True
    # NOTE: vLLM's start-up that found no memory for any KV cache (`Available KV cache memory: -0.53 GiB`) and then
    # `EngineCore failed to start` with no error line: the refusal its start-up rule reads is the cause
    return cut and any(row.source == exception.source and 0 < exception.line - row.line <= SAME_FAILURE_LINES
                       for row in no_cache_rows(ctx))
"""The corrected launch command: the server's own arguments, with every finding's typed change applied.

Only the arguments the engine's vocabulary keeps (`diagnose.vocabulary`: those that matter for tuning, and the
model, parallelism and address) are written, each unless it is at its default. A finding's change
and its companions are applied when they carry a value (a direction alone, or a knob named without a value,
changes nothing); its alternatives are offered in the advice, never applied. When two findings touch the same
flag, the more severe one (the earlier in the list) wins. SGLang's command starts
`python -m sglang.launch_server`, vLLM's `vllm serve MODEL` (its arguments from the engine config and the
`non-default args` line).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from toolkit.diagnose.config import ServerConfig
from toolkit.diagnose.findings import Finding
from toolkit.diagnose.read.launch import SGLANG_LAUNCHER, VLLM_LAUNCHER
from toolkit.diagnose.read.values import Value
from toolkit.diagnose.vocabulary import KNOBS, Knob, knob


def _flag(arg: str) -> str:
    return "--" + arg.replace("_", "-")


def changes(findings: Iterable[Finding]) -> dict[str, Value]:
    """`{argument: new value}` from the findings' changes (True/False for switches); the first finding wins."""
    out: dict[str, Value] = {}
    for f in findings:
        if f.change is None:
            continue
        for change in (f.change, *f.change.companions):
            found = knob(change.idea, f.engine)
            if found is not None and change.value is not None:
                out.setdefault(found.arg, change.value)
    return out


def launch_command(config: ServerConfig, findings: Iterable[Finding]) -> str | None:
    """The launch command with the findings applied; None when the log had no server arguments."""
    args = config.args
    if not args:
        return None
    kept = tuple(k for k in KNOBS[config.advice_engine] if k.kept)
    if config.vllm:
        model = config.value("model")
        launcher = f"{VLLM_LAUNCHER} {_quote(str(model))}" if model else VLLM_LAUNCHER
        return _command(args, findings, launcher, kept)
    return _command(args, findings, SGLANG_LAUNCHER, kept)


def _command(args: Mapping[str, Value], findings: Iterable[Finding], launcher: str, kept: tuple[Knob, ...]) -> str:
    new = changes(findings)
    merged = {k.arg: args.get(k.arg) for k in kept}
    merged.update(new)
    parts = [launcher]
    for k in kept:
        value = merged.get(k.arg)
        if value is None or (value == k.default and not k.always) or (value is False and k.default is False):
            continue
        if value is True:
            parts.append(_flag(k.arg))
        elif value is not False:
            parts.append(f"{_flag(k.arg)} {_quote(str(value))}")
    kept_args = {k.arg for k in kept}
    for arg, value in new.items():
        if arg not in kept_args and value not in (None, False):
            parts.append(_flag(arg) if value is True else f"{_flag(arg)} {_quote(str(value))}")
    return " ".join(parts)


def _quote(value: str) -> str:
    plain = value and all(c.isalnum() or c in "_./:@=+-" for c in value)
    return value if plain else "'" + value.replace("'", "'\\''") + "'"

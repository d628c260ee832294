"""Server flags as `tune` handles them: parse a flag string, change one flag, write the command line, and turn a
diagnose finding's advice into a change the launched engine understands (SGLang's names, or vLLM's).

Advice comes in SGLang's language (`--schedule-conservativeness 0.3`, `on (with --torch-compile-max-bs 32)`,
`remove (graphs on)`, `4096 (or --enable-mixed-chunk)`): the first word is the value for the finding's flag,
`with` pairs come along, `or` alternatives do not. A flag the engine has no name for is not actionable, so no
flag is ever passed that the server would reject or ignore.
"""
from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, NamedTuple, Protocol

Value = str | bool  # True: a switch that is on
Engine = Literal["sglang", "vllm"]
ENGINES: tuple[str, ...] = ("sglang", "vllm")

# Set by the launcher on every launch; advice never changes them.
LAUNCH_FLAGS = frozenset({"--host", "--port", "--log-file"})

# SGLang's name -> vLLM's name for the knobs the tuning guide turns (vLLM has no schedule conservativeness,
# no radix-cache policy and no torch.compile switch of this kind, so advice about those stays SGLang-only).
VLLM_NAMES = {
    "--mem-fraction-static": "--gpu-memory-utilization",
    "--max-running-requests": "--max-num-seqs",
    "--chunked-prefill-size": "--max-num-batched-tokens",
    "--cuda-graph-max-bs": "--max-cudagraph-capture-size",
    "--disable-cuda-graph": "--enforce-eager",
    "--kv-cache-dtype": "--kv-cache-dtype",
    "--quantization": "--quantization",
    "--tp-size": "--tensor-parallel-size",
    "--dp-size": "--data-parallel-size",
    "--context-length": "--max-model-len",
    "--schedule-policy": "--scheduling-policy",
}
SGLANG_NAMES = {vllm: sglang for sglang, vllm in VLLM_NAMES.items()}

_ON, _OFF, _PUSH = {"on", "true", "set", "yes"}, {"off", "remove", "false", "unset", "no"}, {"higher", "lower"}
_VALUE = re.compile(r"-?\d+(\.\d+)?|[A-Za-z][\w.-]*")
_WITH = re.compile(r"\bwith\s+((?:--[a-z][\w-]*(?:\s+[^\s,()-][^\s,()]*)?[\s,]*)+)")
_PAIR = re.compile(r"(--[a-z][\w-]*)(?:\s+([^\s,()-][^\s,()]*))?")


@dataclass(frozen=True, slots=True)
class Flags:
    """An ordered set of `--flag value` pairs (`True` for a switch); changing one returns a new `Flags`."""

    items: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def parse(cls, args: str | Sequence[str]) -> Flags:
        """`"--a 1 --b --c=x"` (or its argv) -> Flags; a flag followed by another flag (or nothing) is a switch."""
        argv = shlex.split(args) if isinstance(args, str) else list(args)
        items: dict[str, Value] = {}
        i = 0
        while i < len(argv):
            token = argv[i]
            if not token.startswith("--"):
                raise ValueError(f"expected a --flag, got {token!r} in {shlex.join(argv)!r}")
            name, eq, inline = token.partition("=")
            if eq:
                items[name] = inline
            elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                items[name] = argv[i + 1]
                i += 1
            else:
                items[name] = True
            i += 1
        return cls(tuple(items.items()))

    def get(self, flag: str) -> Value | None:
        return dict(self.items).get(flag)

    def set(self, flag: str, value: Value | None) -> Flags:
        """`value=None` removes the flag (the server's default applies again)."""
        items = dict(self.items)
        if value is None or value is False:
            items.pop(flag, None)
        else:
            items[flag] = value
        return Flags(tuple(items.items()))

    def argv(self) -> list[str]:
        out: list[str] = []
        for flag, value in self.items:
            out.extend([flag] if value is True else [flag, str(value)])
        return out

    def text(self) -> str:
        return shlex.join(self.argv())

    @property
    def key(self) -> frozenset[tuple[str, Value]]:
        """Equal for the same settings in any order."""
        return frozenset(self.items)

    def differences(self, other: Flags) -> list[tuple[str, Value | None, Value | None]]:
        """(flag, value here, value there) for every flag that differs."""
        mine, theirs = dict(self.items), dict(other.items)
        names = list(mine) + [f for f in theirs if f not in mine]
        return [(f, mine.get(f), theirs.get(f)) for f in names if mine.get(f) != theirs.get(f)]


def show(value: Value | None) -> str:
    return "(default)" if value is None else "on" if value is True else str(value)


class Advice(Protocol):
    """What `tune` reads of a diagnose `Finding`."""

    id: str
    severity: str
    title: str
    flag: str | None
    suggested: str | None
    current: str | None


class Change(NamedTuple):
    """Set `flag` to `value` (None: remove it), with any `companions` the advice names alongside."""

    flag: str
    value: Value | None
    companions: tuple[tuple[str, Value], ...] = ()

    def apply(self, flags: Flags) -> Flags:
        flags = flags.set(self.flag, self.value)
        for flag, value in self.companions:
            flags = flags.set(flag, value)
        return flags

    def describe(self, before: Flags) -> str:
        parts = [f"{self.flag} {show(before.get(self.flag))} → {show(self.value)}"]
        parts += [f"{flag} {show(before.get(flag))} → {show(value)}" for flag, value in self.companions]
        return ", ".join(parts)


class Proposal(NamedTuple):
    """A finding's advice in the engine's names: a value, or only a direction for a push-until-it-breaks knob."""

    flag: str
    value: Value | None
    direction: int = 0  # +1 / -1 when the advice says "higher" / "lower" without a value
    companions: tuple[tuple[str, Value], ...] = ()


class Spec(NamedTuple):
    """A flag's kind ("switch", "int", "float", "str") and, when it has them, its choices."""

    kind: str
    choices: frozenset[str] | None = None


VLLM_SPECS = {
    "--gpu-memory-utilization": Spec("float"), "--max-num-seqs": Spec("int"), "--max-num-batched-tokens": Spec("int"),
    "--max-cudagraph-capture-size": Spec("int"), "--enforce-eager": Spec("switch"),
    "--kv-cache-dtype": Spec("str", frozenset({"auto", "fp8", "fp8_e5m2", "fp8_e4m3"})), "--quantization": Spec("str"),
    "--tensor-parallel-size": Spec("int"), "--data-parallel-size": Spec("int"), "--max-model-len": Spec("int"),
    "--scheduling-policy": Spec("str", frozenset({"fcfs", "priority"})),
}


def _spec(action) -> Spec:
    if action.nargs == 0:
        return Spec("switch")
    kind = {int: "int", float: "float"}.get(action.type, "str")
    return Spec(kind, frozenset(map(str, action.choices)) if action.choices else None)


@lru_cache(maxsize=1)
def sglang_specs() -> dict[str, Spec]:
    """Every flag of `toolkit serve`, whose flags mirror SGLang's `launch_server`, with its kind."""
    from toolkit.runtime.server_args import build_parser

    return {o: _spec(a) for a in build_parser()._actions for o in a.option_strings
            if o.startswith("--") and o != "--help"}


def spec_of(flag: str, engine: Engine) -> Spec | None:
    return (VLLM_SPECS if engine == "vllm" else sglang_specs()).get(flag)


def engine_flag(flag: str, engine: Engine) -> str | None:
    """The engine's name for a flag diagnose names in SGLang's or vLLM's words (it uses the words of the engine
    that wrote the log), or None when the engine has no such knob or tune must not touch it."""
    if flag in LAUNCH_FLAGS:
        return None
    if engine == "vllm":
        name = flag if flag in VLLM_SPECS else VLLM_NAMES.get(flag)
    else:
        name = flag if flag in sglang_specs() else SGLANG_NAMES.get(flag)
    return name if name is not None and spec_of(name, engine) is not None else None


def accepts(spec: Spec, value: str) -> bool:
    """Whether `value` is a value of the flag's kind (and among its choices)."""
    if spec.choices is not None:
        return value in spec.choices
    caster = {"int": int, "float": float}.get(spec.kind)
    if caster is None:
        return spec.kind == "str"
    try:
        caster(value)
    except ValueError:
        return False
    return True


def _value(word: str, spec: Spec) -> Value | None:
    """The advice's first word as a value (None: remove the flag); `ValueError` when the flag cannot take it."""
    low = word.lower()
    if spec.kind == "switch":
        if low in _ON | _OFF:
            return True if low in _ON else None
        raise ValueError(word)
    if low in _ON | _OFF or not _VALUE.fullmatch(word) or not accepts(spec, word):
        raise ValueError(word)
    return word


def _companions(text: str, engine: Engine) -> tuple[tuple[str, Value], ...] | None:
    pairs: list[tuple[str, Value]] = []
    for group in _WITH.findall(text):
        for flag, raw in _PAIR.findall(group):
            name = engine_flag(flag, engine)
            try:
                value = _value(raw or "on", spec_of(name, engine)) if name is not None else None
            except ValueError:
                value = None
            if value is None:
                return None  # NOTE: half of a joint change is not the change the advice asked for
            pairs.append((name, value))
    return tuple(pairs)


def propose(advice: Advice, engine: Engine) -> Proposal | None:
    """The finding's advice as a flag change for `engine`, or None when nothing the server accepts would follow.

    NOTE: "remove" on a valued flag would hand back the server's default, not a tested value, so it is not taken."""
    if not advice.flag or not advice.flag.startswith("--") or not advice.suggested:
        return None
    flag = engine_flag(advice.flag, engine)
    companions = _companions(advice.suggested, engine)
    if flag is None or companions is None:
        return None
    word = advice.suggested.split()[0].rstrip(",;")
    spec = spec_of(flag, engine)
    if word.lower() in _PUSH:
        return Proposal(flag, None, 1 if word.lower() == "higher" else -1, companions) if spec.kind in (
            "int", "float") else None
    try:
        return Proposal(flag, _value(word, spec), 0, companions)
    except ValueError:
        return None


def numeric(value: Value | None) -> float | None:
    """The number a value starts with (`"0.9 (default)"` -> 0.9), or None."""
    if value is None or isinstance(value, bool) or not str(value).split():
        return None
    try:
        return float(str(value).split()[0])
    except ValueError:
        return None


def launch_line(template: Iterable[str], flags: Flags) -> str:
    """A launch command as one shell line, with `{flags}` filled in."""
    parts: list[str] = []
    for token in template:
        parts.extend(flags.argv() if token == "{flags}" else [token])
    return shlex.join(parts)

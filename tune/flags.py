"""Server flags as `tune` handles them: parse a flag string, change one flag, write the command line, and turn a
diagnose finding's typed change into a change the launched engine understands (SGLang's names, or vLLM's).

A finding's change names an idea; its flag for the launched engine comes from diagnose's one table
(`diagnose/vocabulary.py`). Its companions come along, its alternatives do not. An idea the engine has no flag for,
or a value the engine's flag does not take, is not actionable, so no flag is ever passed that the server would
reject or ignore.
"""
from __future__ import annotations

import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from toolkit.diagnose.findings import Current
from toolkit.diagnose.vocabulary import Change, Engine, Knob, knob
from toolkit.diagnose.vocabulary import ChangeValue as Value  # a flag's value; True: a switch that is on


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
    change: Change | None
    current: Current | None
    serves: str  # `latency`: a change that trades throughput for latency


class FlagChange(NamedTuple):
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


def engine_flag(idea: str, engine: Engine) -> str | None:
    """The engine's flag for a tuning idea, or None when the engine has no such knob (or `toolkit tune` does not pass
    it: `diagnose.vocabulary` gives it no kind)."""
    found = knob(idea, engine)
    return found.flag if found is not None and found.kind is not None else None


def accepts(found: Knob, value: str) -> bool:
    """Whether `value` is a value of the knob's kind (and among its choices)."""
    if found.choices is not None:
        return value in found.choices
    caster = {"int": int, "float": float}.get(found.kind)  # type: ignore[arg-type]
    if caster is None:
        return found.kind == "str"
    try:
        caster(value)
    except ValueError:
        return False
    return True


def _value(value: Value, found: Knob) -> Value | None:
    """The change's value for the knob (None: remove it); `ValueError` when the knob cannot take it.

    NOTE: switching a valued flag off would hand back the server's default, not a tested value, so it is not taken."""
    if found.kind == "switch":
        if isinstance(value, bool):
            return True if value else None
        raise ValueError(value)
    if isinstance(value, bool) or not accepts(found, value):
        raise ValueError(value)
    return value


def _setting(change: Change, engine: Engine) -> tuple[str, Value | None] | None:
    """(flag, value) of a change that carries a value, or None when the engine cannot take it."""
    found = knob(change.idea, engine)
    if found is None or found.kind is None or change.value is None:
        return None
    try:
        return found.flag, _value(change.value, found)
    except ValueError:
        return None


def propose(advice: Advice, engine: Engine) -> Proposal | None:
    """The finding's change as a flag change for `engine`, or None when nothing the server accepts would follow."""
    change = advice.change
    if change is None or not change.moves:
        return None
    companions = tuple(_setting(c, engine) for c in change.companions)
    if any(c is None or c[1] is None for c in companions):
        return None  # NOTE: half of a joint change is not the change the advice asked for
    if change.direction:
        found = knob(change.idea, engine)
        if found is None or found.kind not in ("int", "float"):
            return None
        return Proposal(found.flag, None, change.direction, companions)
    setting = _setting(change, engine)
    return Proposal(*setting, 0, companions) if setting is not None else None


def numeric(value: object) -> float | None:
    """A flag's value (or a finding's current value) as a number, None where it is none."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def launch_line(template: Iterable[str], flags: Flags) -> str:
    """A launch command as one shell line, with `{flags}` filled in."""
    parts: list[str] = []
    for token in template:
        parts.extend(flags.argv() if token == "{flags}" else [token])
    return shlex.join(parts)

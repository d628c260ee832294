"""Outer prefixes before SGLang's stamp (docker compose, CRI, Ray, journald: `read.prefix.OUTER_PREFIXES`),
and vLLM's process prefix before its API server's access line (`TIMELESS_PROCESS`): how many bytes of each line
to skip so that the scanner meets the stamp (or the access line) where it reads one.

A chunk's prefixed lines share a few layouts. The first line no layout matches yet is read by the declared
grammar (a bytes regex) once; its prefix and what follows it, digits standing for any digit, become a layout
that every other line is compared with in word operations. The per-line parser takes time and rank from the
stamp alone, whatever unquoted text without a stamp comes before it, so a stripped line reads the same.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from toolkit.diagnose.read.fastpath.words import Words, all_digits, gather
from toolkit.diagnose.read.messages import UVICORN_ACCESS
from toolkit.diagnose.read.prefix import OUTER_PREFIX, TIMELESS_PROCESS

MAX_OUTER = 96  # bytes read per line: a longer prefix (with what follows it) leaves the line to the per-line path
MAX_TRIES = 16  # lines per chunk read by the grammar; lines no layout of those matches take the per-line path


class Form(NamedTuple):
    """Prefixes of one grammar followed by `follow`; `leads`, if set, the bytes every one can start with (else any
    but the stamp's `[`): the grammar reads no line that starts otherwise, so that a chunk's other lines do not use
    up its `MAX_TRIES`."""

    grammar: re.Pattern[bytes]
    follow: bytes
    leads: bytes | None = None


BEFORE_STAMP = Form(re.compile(b"(?:" + OUTER_PREFIX.encode() + rb")(?=\[)"), b"[")
BEFORE_ACCESS = Form(re.compile(TIMELESS_PROCESS.encode() + b"(?=" + re.escape(UVICORN_ACCESS.encode()) + b")"),
                     UVICORN_ACCESS.encode(), b"(")
_DIGITS = frozenset(b"0123456789")


@dataclass(frozen=True, slots=True)
class _Layout:
    """A prefix and what follows it as words: `fixed` masks the bytes that must equal `value`, `digits` those
    that must be digits."""

    length: int
    value: tuple[np.uint64, ...]
    fixed: tuple[np.uint64, ...]
    digits: tuple[np.uint64, ...]

    def matches(self, head: np.ndarray) -> np.ndarray:
        ok = np.ones(head.shape[1], bool)
        for k, (value, fixed, digits) in enumerate(zip(self.value, self.fixed, self.digits)):
            ok &= ((head[k] & fixed) == value) & all_digits(head[k], digits)
        return ok


_LAYOUTS: dict[bytes, _Layout] = {}


def _layout(prefix: bytes) -> _Layout:
    """The layout of one matched prefix and what follows it, made once per process for each distinct one."""
    key = bytes(ord("0") if c in _DIGITS else c for c in prefix)
    layout = _LAYOUTS.get(key)
    if layout is None:
        pad = -len(prefix) % 8
        digits = bytes(0xFF if c in _DIGITS else 0 for c in prefix) + bytes(pad)
        fixed = bytes(0 if c in _DIGITS else 0xFF for c in prefix) + bytes(pad)
        value = bytes(0 if c in _DIGITS else c for c in prefix) + bytes(pad)
        words = [tuple(np.frombuffer(b, np.uint64)) for b in (value, fixed, digits)]
        layout = _Layout(len(prefix), *words)
        if len(_LAYOUTS) < 4096:
            _LAYOUTS[key] = layout
    return layout


def outer_lengths(words: Words, starts: np.ndarray, form: Form = BEFORE_STAMP) -> np.ndarray:
    """Per line starting at `starts`: the length of its outer prefix of `form` (what the form says follows it),
    0 where it has none or none is read here."""
    return prefix_layouts(words, starts, form)[0]


def prefix_layouts(words: Words, starts: np.ndarray,
                   form: Form) -> tuple[np.ndarray, np.ndarray, list[re.Match[bytes]]]:
    """Per line starting at `starts`: the length of its prefix of `form` (0 where it has none or none is read
    here) and which layout it has (-1: none); and per layout, the grammar's match on the line it was made from
    (every line of a layout has its groups at the same offsets)."""
    grammar, follow, leads = form
    skip = np.zeros(len(starts), np.int64)
    which = np.full(len(starts), -1, np.int64)
    found: list[re.Match[bytes]] = []
    first_bytes = words.bytes[starts]
    undecided = np.flatnonzero(first_bytes != ord("[") if leads is None
                               else np.isin(first_bytes, np.frombuffer(leads, np.uint8)))
    if len(undecided) == 0:
        return skip, which, found
    head = np.ascontiguousarray(gather(words, starts[undecided], MAX_OUTER).T)  # word k of every line is head[k]
    left = np.ones(len(undecided), bool)
    for _ in range(MAX_TRIES):
        first = int(left.argmax())
        if not left[first]:
            break
        left[first] = False
        m = grammar.match(head[:, first].tobytes())
        if m is None or m.end() + len(follow) > MAX_OUTER:
            continue
        layout = _layout(m.group() + follow)
        open_lines = np.flatnonzero(left)
        match = np.append(open_lines[layout.matches(head[: (layout.length + 7) // 8, open_lines])], first)
        left[match] = False
        skip[undecided[match]] = m.end()
        which[undecided[match]] = len(found)
        found.append(m)
    return skip, which, found

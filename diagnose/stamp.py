"""The text before a message: timestamp and rank tag, in any era's logger format (LOG_FORMATS §1, §11).

Arbitrary text may precede the tag (docker compose, Ray, kubectl, other loggers); the tag closest to the
message wins. Times are seconds on the log's clock: naive timestamps are read as UTC; `HH:MM:SS` (0.2.15-0.3.0)
gives seconds within day 0, and the parser adds days when the clock wraps.
"""
from __future__ import annotations

import calendar
import re
from functools import lru_cache
from typing import NamedTuple

_TIME = r"(?:(\d{4})-(\d\d)-(\d\d)[ T])?(\d\d):(\d\d):(\d\d)(?:[.,](\d{1,9}))?Z?"
_TAG = re.compile(r"\[" + _TIME + r"((?:\s+[A-Z][A-Z_]*\d+)*)\s*\]")
_RANKS_ONLY = re.compile(r"\[((?:\s*(?:DP|PP|TP|EP|CP|ATTN_CP|ATTN_TP|ATTN_DP|MOE_DP|MOE_TP|MOE_EP)\d+)+)\s*\]")
_GPU = re.compile(r"\[gpu(?:_id)?=(\d+)\]|\bRank (\d+):")
_BARE = re.compile(_TIME)


class Stamp(NamedTuple):
    time: float | None
    rank: str
    dated: bool


NO_STAMP = Stamp(None, "", False)


@lru_cache(maxsize=512)
def _midnight(y: int, mo: int, d: int) -> float:
    return float(calendar.timegm((y, mo, d, 0, 0, 0, 0, 0, 0)))


def _seconds(g: tuple[str | None, ...]) -> tuple[float, bool]:
    y, mo, d, h, mi, s, frac = g
    tod = int(h) * 3600 + int(mi) * 60 + int(s) + (float("0." + frac) if frac else 0.0)  # type: ignore[arg-type]
    if y is None:
        return tod, False
    if not (1 <= int(mo) <= 12 and 1 <= int(d) <= 31):  # type: ignore[arg-type]
        raise ValueError("bad date")
    return _midnight(int(y), int(mo), int(d)) + tod, True  # type: ignore[arg-type]


def _rank(tags: str) -> str:
    return " ".join(tags.split())


_FAST = re.compile(r"\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)((?: [A-Z][A-Z_]*\d+)*)\] $")


def read_stamp(prefix: str) -> Stamp:
    """Time and rank from the text before a message; `NO_STAMP` parts where none can be read."""
    fast = _FAST.match(prefix)
    if fast is not None:
        y, mo, d, h, mi, s, tags = fast.groups()
        if 1 <= int(mo) <= 12 and 1 <= int(d) <= 31 and int(y) >= 1:
            tod = int(h) * 3600 + int(mi) * 60 + int(s)
            return Stamp(_midnight(int(y), int(mo), int(d)) + tod, tags.strip(), True)
    try:
        last = None
        for last in _TAG.finditer(prefix):
            pass
        if last is not None:
            t, dated = _seconds(last.groups()[:7])
            return Stamp(t, _rank(last.group(8)), dated)
        rank = ""
        ranks = _RANKS_ONLY.search(prefix)
        if ranks:
            rank = _rank(ranks.group(1))
        gpu = _GPU.search(prefix)
        if gpu:
            rank = f"GPU{gpu.group(1)}" if gpu.group(1) else f"TP{gpu.group(2)}"
        bare = None
        for bare in _BARE.finditer(prefix):
            pass
        if bare is None:
            return Stamp(None, rank, False)
        t, dated = _seconds(bare.groups())
        return Stamp(t, rank, dated)
    except (ValueError, OverflowError):
        return NO_STAMP


HAS_STAMP = re.compile(r"\[(?:\d{4}-\d\d-\d\d[ T])?\d\d:\d\d:\d\d|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")

"""Plain lines told from their bytes: the range workers' quick answer to `lines.is_plain` for the commonest plain
lines (a printable ASCII line behind an SGLang stamp or a vLLM prefix whose message is no event), without decoding
them. It answers True only where `is_plain` of the decoded line does (tests/diagnose/test_log_format_differential.py
checks it on every sample, real and benchmark line and on lines changed at random); False means "ask `is_plain`".
"""
from __future__ import annotations

import functools
import re

from toolkit.diagnose.log_format.prefix import (FIRST_STAMP, FIRST_STAMP_DATE, NOTHING_MORE, VLLM_DEFAULT_YEAR,
                                                VLLM_MONTH_DAY, VLLM_PREFIX, is_date)
from toolkit.diagnose.messages import NO_EVENT

# NOTE: `is_plain` of a printable ASCII line (tabs too), matched on its bytes: on ASCII text a bytes pattern and a
# str pattern match alike (`\s`, `\w`, `\d`, case folding), and decoding it removes nothing (no CR, no escape
# code). Each pattern is the prefix `is_plain` reads first, in an atomic group (the match it takes), then no event.
_PLAIN_SGLANG = re.compile((FIRST_STAMP + NOTHING_MORE + NO_EVENT).encode("ascii"))
# a vLLM prefix at the line's start, no SGLang stamp on the line (`read_prefix` would read that first) and no record
# glued after it (`glued_records`)
_PLAIN_VLLM = re.compile(("(?!" + FIRST_STAMP + ")(?>" + VLLM_PREFIX + ")" + NO_EVENT + r"(?!.*?\s" + VLLM_PREFIX
                          + ")").encode("ascii"))
_VLLM_DATE = tuple(re.compile(FIRST_STAMP).groups + g for g in VLLM_MONTH_DAY)
_NOT_PRINTABLE = bytes(sorted(set(range(256)) - {ord("\t")} - set(range(0x20, 0x7F))))


def surely_plain(raw: bytes | bytearray) -> bool:
    """True only for a line (its bytes, no newline) that `is_plain` reads as plain once decoded: a printable ASCII
    line behind an SGLang stamp or a vLLM prefix, the commonest plain lines, told without decoding; False: ask
    `is_plain`."""
    if len(raw.translate(None, _NOT_PRINTABLE)) != len(raw):
        return False
    m = _PLAIN_SGLANG.match(raw)
    if m is not None:
        return _is_calendar_date(*m.group(*FIRST_STAMP_DATE))
    m = _PLAIN_VLLM.match(raw)
    return m is not None and _is_calendar_date(VLLM_DEFAULT_YEAR, *m.group(*_VLLM_DATE))


@functools.lru_cache(maxsize=256)
def _is_calendar_date(year: bytes | int | None, month: bytes | None, day: bytes | None) -> bool:
    """A stamp without a date is a time of day (`stamped_message_start` takes it)."""
    return month is None or bool(is_date(int(year or 0), int(month), int(day or 0)))

"""The HTML itself: one Jinja2 template with autoescaping on, so every string from a log or a response is text."""
from __future__ import annotations

import math
from functools import lru_cache

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape


def num(value: object, digits: int = 2) -> str:
    """Numbers for tables: thousands separators, `-` for missing or non-finite values."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if math.isfinite(value) else "-"
    return str(value)


@lru_cache(maxsize=1)
def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("toolkit.reports", "templates"),
        autoescape=select_autoescape(enabled_extensions=("html", "jinja"), default_for_string=True, default=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["num"] = num
    return env


def render_html(context: dict) -> str:
    return environment().get_template("report.html.jinja").render(**context)

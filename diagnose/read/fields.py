"""Every message kind's fields, declared once (docs/log-formats.md §2-§9): each kind's `Fields` (its reader, and its
schema: keys and types) is declared beside the grammar of its messages (`batch`, `requests`, `startup`, `errors`,
`arguments`, `launch`; the facts a line's prefix tells, in `prefix`) and gathered here. `parse_fields(kind, text)`
reads one message's.
"""
from __future__ import annotations

from toolkit.diagnose.read import arguments, batch, errors, launch, requests, startup
from toolkit.diagnose.read.messages import FACT_KINDS, KINDS
from toolkit.diagnose.read.prefix import FACT_FIELDS
from toolkit.diagnose.read.values import Fields, Value

FIELDS: dict[str, Fields] = (batch.FIELDS | requests.FIELDS | startup.FIELDS | errors.FIELDS | arguments.FIELDS
                             | launch.FIELDS | FACT_FIELDS)
assert set(FIELDS) == set(KINDS) | FACT_KINDS, "every kind declares its fields, once"


def parse_fields(kind: str, text: str) -> dict[str, Value]:
    """The fields of one event's message; never raises, returns what could be read."""
    try:
        return FIELDS[kind].read(text)
    except Exception:  # noqa: BLE001 - a garbled line yields no fields, never an error
        return {}

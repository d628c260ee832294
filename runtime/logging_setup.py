"""SGLang's log format: `[YYYY-mm-dd HH:MM:SS] message`, optionally tee'd to `--log-file`; secrets (the API
key) are masked as '***' in every line, tracebacks included."""
from __future__ import annotations

import logging
import sys

LOG_FORMAT = "[%(asctime)s%(rank_tag)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class _RedactingFormatter(logging.Formatter):
    def __init__(self, secrets: tuple[str, ...]) -> None:
        super().__init__(LOG_FORMAT, datefmt=DATE_FORMAT)
        self.secrets = tuple(s for s in secrets if s)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return text


class _RankTag(logging.Filter):
    def __init__(self, tag: str) -> None:
        super().__init__()
        self.tag = tag

    def filter(self, record: logging.LogRecord) -> bool:
        record.rank_tag = self.tag
        return True


def configure_logging(level: str = "info", log_file: str | None = None, rank_tag: str = "",
                      secrets: tuple[str, ...] = ()) -> None:
    """Route the `runtime` logger to stderr at `level` and, with --log-file, to that file at INFO or below."""
    formatter = _RedactingFormatter(secrets)
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        handlers.append(logging.FileHandler(log_file, encoding="utf-8"))
    root = logging.getLogger("runtime")
    for handler in [h for h in root.handlers if getattr(h, "toolkit_owned", False)]:
        root.removeHandler(handler)
        handler.close()
    threshold = logging.getLevelName(level.upper())
    for handler in handlers:
        handler.setFormatter(formatter)
        handler.addFilter(_RankTag(rank_tag))
        # NOTE: the file keeps INFO whatever --log-level says: its batch lines are what `toolkit diagnose` reads.
        handler.setLevel(min(threshold, logging.INFO) if isinstance(handler, logging.FileHandler) else threshold)
        handler.toolkit_owned = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    # NOTE: the logger passes INFO so in-process observers (tests, the demo) see the SGLang lines; each
    # handler applies --log-level.
    root.setLevel(min(threshold, logging.INFO))
    root.propagate = False

"""The API key never appears in a log line: `server_args=` shows it as '***', and every handler masks it."""
from __future__ import annotations

import dataclasses
import io
import logging

from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.server_args import ServerArgs

KEY = "sk-very-secret-42"


def test_server_args_repr_masks_the_api_key():
    args = ServerArgs(api_key=KEY, port=1234)
    text = repr(args)
    assert "api_key='***'" in text and KEY not in text and "port=1234" in text
    assert "api_key=None" in repr(ServerArgs())
    assert dataclasses.replace(args, port=5).api_key == KEY  # the value itself is kept


def test_every_log_line_masks_the_secrets(tmp_path):
    log_file = tmp_path / "server.log"
    configure_logging("info", str(log_file), secrets=(KEY,))
    logger = logging.getLogger("runtime")
    stream = io.StringIO()
    for handler in logger.handlers:  # NOTE: only ours: pytest may have attached its own capture handler
        if getattr(handler, "toolkit_owned", False) and not isinstance(handler, logging.FileHandler):
            handler.setStream(stream)
    try:
        logger.info(f"the client sent Authorization: Bearer {KEY}")
        try:
            raise ValueError(f"bad key {KEY}")
        except ValueError:
            logger.exception("failed")
    finally:
        configure_logging("warning")
    written = log_file.read_text() + stream.getvalue()
    assert "Bearer ***" in written and "bad key ***" in written
    assert KEY not in written

"""`--open`: a browser when the machine has a display, otherwise the page served on 127.0.0.1 until Ctrl-C."""
from __future__ import annotations

import os
import sys
import webbrowser
from collections.abc import Callable
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def has_display() -> bool:
    return sys.platform in ("darwin", "win32") or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


class _ReportHandler(BaseHTTPRequestHandler):
    """Serves the one report file at `/` (and its own name); everything else is 404."""

    def __init__(self, *args, report: Path, **kwargs):
        self.report = report
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?")[0] not in ("/", f"/{self.report.name}"):
            self.send_error(404)
            return
        body = self.report.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass


def server_for(report: Path, port: int = 0) -> ThreadingHTTPServer:
    """A server bound to 127.0.0.1 (port 0: a free one) that serves `report`."""
    return ThreadingHTTPServer(("127.0.0.1", port), partial(_ReportHandler, report=report.resolve()))


def url_of(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/"


def serve(report: Path, say: Callable[[str], None]) -> None:
    """Serve until Ctrl-C."""
    with server_for(report) as server:
        say(f"serving {report} at {url_of(server)}  (Ctrl-C to stop)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            say("stopped")


def show(report: Path, say: Callable[[str], None]) -> None:
    if has_display() and webbrowser.open(report.resolve().as_uri()):
        say(f"opened {report} in a browser")
        return
    serve(report, say)

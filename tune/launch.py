"""The launch command `tune` runs for each configuration: `toolkit serve` by default, or any serving command.

A `--launch` template is a shell line with placeholders: `{flags}` (the configuration's flags; appended at the
end when absent), `{port}` (a free port; when absent, `--host 127.0.0.1 --port PORT` is appended, which SGLang
and vLLM both accept) and `{log}` (a log file to pass to the server; when absent, the server's own output is
its log, as SGLang and vLLM print theirs). Servers always run through `tune.launcher.ServerProcess`.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from toolkit.tune.flags import Flags, launch_line
from toolkit.tune.launcher import ServerProcess, free_port, toolkit_command

# NOTE: a decode line every 5 steps (SGLang's default is 40) gives diagnose enough steady-state lines in a run of
# a few seconds; the start flags come after it, so a user's own --decode-log-interval wins.
DEFAULT_TEMPLATE = (*toolkit_command("serve"), "--host", "127.0.0.1", "--port", "{port}", "--log-file", "{log}",
                    "--decode-log-interval", "5", "{flags}")
LOG_NAME, OUTPUT_NAME = "server.log", "server.out"


def template_tokens(template: str | None) -> tuple[str, ...]:
    if template is None:
        return DEFAULT_TEMPLATE
    tokens = shlex.split(template)
    if not tokens:
        raise ValueError("--launch is empty")
    if "{flags}" not in tokens:
        tokens.append("{flags}")
    if not any("{port}" in t for t in tokens):
        tokens += (["--host", "127.0.0.1"] if "--host" not in tokens else []) + ["--port", "{port}"]
    return tuple(tokens)


@dataclass(slots=True)
class RunningServer:
    process: ServerProcess
    log: Path

    @property
    def url(self) -> str:
        return self.process.url

    def alive(self) -> bool:
        return self.process.proc.poll() is None

    def stop(self) -> int:
        return self.process.stop()


class CommandLauncher:
    def __init__(self, template: str | None = None, health_timeout: float = 600.0):
        self.tokens = template_tokens(template)
        self.shown = ("toolkit", "serve", "{flags}") if template is None else tuple(shlex.split(template))
        self.health_timeout = health_timeout
        self.writes_log = any("{log}" in t for t in self.tokens)

    def log_path(self, folder: Path) -> Path:
        return folder / (LOG_NAME if self.writes_log else OUTPUT_NAME)

    def command(self, flags: Flags, port: int, folder: Path) -> list[str]:
        log = str(self.log_path(folder))
        out: list[str] = []
        for token in self.tokens:
            if token == "{flags}":
                out.extend(flags.argv())
            else:
                out.append(token.replace("{port}", str(port)).replace("{log}", log))
        return out

    def display(self, flags: Flags) -> str:
        """The launch command for `flags` as the user would type it (their template, or `toolkit serve ...`)."""
        shown = self.shown if "{flags}" in self.shown else (*self.shown, "{flags}")
        return launch_line(shown, flags)

    def launch(self, flags: Flags, folder: Path) -> RunningServer:
        folder.mkdir(parents=True, exist_ok=True)
        port = free_port()
        process = ServerProcess(self.command(flags, port, folder), port, folder / OUTPUT_NAME)
        try:
            process.wait_healthy(self.health_timeout)
        except BaseException:
            process.stop()  # NOTE: also on Ctrl-C while waiting: no server outlives its step
            raise
        return RunningServer(process, self.log_path(folder))

"""`toolkit demo`: the main job in one command on the embedded model.

serve (log to a file) → wait for health → bench sweep (saturation first, then rates below it, so the server
saturates on whatever machine this is) → stop the server → diagnose its log → one HTML report.
"""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

HEALTH_TIMEOUT = 600.0
STOP_TIMEOUT = 10.0
SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}


@dataclass(frozen=True)
class DemoSettings:
    out_dir: Path
    num_prompts: int = 32
    input_len: int = 256
    output_len: int = 64
    device: str = "auto"
    decode_log_interval: int = 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _toolkit(*args: str) -> list[str]:
    return [sys.executable, "-m", "toolkit.cli", *args]


class DemoServer:
    """`toolkit serve` in a child process, always stopped on the way out."""

    def __init__(self, settings: DemoSettings, console: Console) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = settings.out_dir / "server.log"
        self.console = console
        self._output = open(settings.out_dir / "serve.out", "w")
        self.proc = subprocess.Popen(
            _toolkit("serve", "--host", "127.0.0.1", "--port", str(self.port), "--device", settings.device,
                     "--log-file", str(self.log_file), "--enable-metrics",
                     "--decode-log-interval", str(settings.decode_log_interval)),
            stdout=self._output, stderr=subprocess.STDOUT,
        )

    def wait_healthy(self) -> None:
        import requests

        deadline = time.monotonic() + HEALTH_TIMEOUT
        with self.console.status("starting toolkit serve on the embedded SmolLM2-135M-Instruct…"):
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"toolkit serve exited with code {self.proc.returncode}; see "
                                       f"{self._output.name}")
                try:
                    if requests.get(f"{self.url}/health", timeout=1).status_code == 200:
                        return
                except requests.RequestException:
                    pass
                time.sleep(0.5)
        raise RuntimeError(f"toolkit serve was not healthy within {HEALTH_TIMEOUT:.0f} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(STOP_TIMEOUT)
        self._output.close()


def _run_bench(settings: DemoSettings, server: DemoServer, records_path: Path) -> list[dict]:
    command = _toolkit(
        "bench", "--base-url", server.url, "--backend", "sglang", "--dataset", "random",
        "--random-input-len", str(settings.input_len), "--random-output-len", str(settings.output_len),
        "--random-range-ratio", "0.5", "--num-prompts", str(settings.num_prompts), "--sweep",
        "--warmup-requests", "2", "--scrape-metrics", "--server-log", str(server.log_file),
        "--output-file", str(records_path),
    )
    code = subprocess.call(command)
    if code != 0 or not records_path.exists():
        raise RuntimeError(f"toolkit bench failed with exit code {code}")
    return [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]


def _write_report(settings: DemoSettings, records: list[dict], log: Path):
    from toolkit.reports.build import diagnose_log, render_report, write_html

    diagnosis = diagnose_log(records, log)
    title = "toolkit demo: SmolLM2-135M-Instruct on this machine"
    path = write_html(render_report(records, diagnosis, title, [str(settings.out_dir / "bench.jsonl")]),
                      settings.out_dir / "report.html")
    return path, diagnosis


def _print_summary(console: Console, report: Path, diagnosis, records: list[dict]) -> None:
    best = max(records, key=lambda r: r.get("output_throughput") or 0.0)
    console.rule("[bold]toolkit demo done")
    console.print(f"peak output throughput: {best.get('output_throughput', 0.0):.1f} tok/s at rate "
                  f"{best.get('request_rate')} ({len(records)} bench runs)")
    console.print(f"diagnosis: {diagnosis.verdict}")
    for finding in diagnosis.findings[:3]:
        style = SEVERITY_STYLE.get(finding.severity, "")
        flag = f" → {finding.flag} {finding.suggested or ''}".rstrip() if finding.flag else ""
        console.print(f"  [{style}]{finding.severity}[/] {finding.title}{flag}", highlight=False)
    console.print(f"report: [bold]{report.resolve()}[/]")


def run_demo(settings: DemoSettings, console: Console | None = None) -> Path:
    """Run the whole loop; returns the report's path. The server never outlives this call."""
    console = console or Console()
    settings.out_dir.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    server = DemoServer(settings, console)
    try:
        server.wait_healthy()
        console.print(f"[green]✓[/] toolkit serve is up at {server.url} (log: {server.log_file})")
        records = _run_bench(settings, server, settings.out_dir / "bench.jsonl")
    finally:
        with console.status("stopping the server…"):
            server.stop()
        signal.signal(signal.SIGTERM, previous)
    console.print(f"[green]✓[/] server stopped; diagnosing {server.log_file.name} and writing the report")
    report, diagnosis = _write_report(settings, records, server.log_file)
    _print_summary(console, report, diagnosis, records)
    return report


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt

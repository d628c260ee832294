"""The HTTP process stays light: it never imports torch or the model code (the scheduler process owns them)."""
from __future__ import annotations

import subprocess
import sys

from tests.server.server_process import ServerProcess



def test_importing_the_front_end_does_not_import_torch():
    code = ("import sys\nimport toolkit.runtime.server.serve\nimport toolkit.runtime.model_loader.fast_tokenizer\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers') "
            "or m.startswith(('toolkit.runtime.scheduler', 'toolkit.runtime.model_runner', 'toolkit.runtime.models'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_running_server_front_end_has_not_loaded_torch():
    """The live HTTP process (not the scheduler child) has no torch in its memory map after serving a request."""
    server = ServerProcess("--max-total-tokens", "2048").wait_healthy()
    try:
        import requests

        reply = requests.post(f"{server.url}/v1/chat/completions", timeout=60, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0})
        assert reply.status_code == 200, reply.text
        maps = open(f"/proc/{server.proc.pid}/maps").read()
        assert "libtorch" not in maps, "the HTTP process mapped libtorch"
        assert server.scheduler_pid() != server.proc.pid
        child_maps = open(f"/proc/{server.scheduler_pid()}/maps").read()
        assert "libtorch" in child_maps, "the scheduler process is where torch lives"
    finally:
        server.stop()

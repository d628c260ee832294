"""`toolkit serve` with --tp-size, --nnodes and --dp-size on this CPU (gloo, float32, a tiny model whose heads split
by 2): the same greedy tokens as one device, only TP0 writing batch lines, two separately started nodes forming one
TP group, DP replicas sharing 64 concurrent requests, and every way a rank can be lost ending in a non-zero exit
that names it, within a bounded time, with no process left behind."""
from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.machine_speed import scaled
from tests.runtime.engine_fixtures import random_prompts, tiny_engine
from tests.runtime.tiny_models import make_tiny_model
from tests.server.server_process import ServerProcess, alive, children_of, cmdline, family
from toolkit.runtime.distributed.topology import free_port
from toolkit.runtime.model_loader.embedded import embedded_model_path
from toolkit.tune import launcher

pytestmark = pytest.mark.slow  # a long unit: it starts early (tests/xdist_units.py)

NEW_TOKENS = 8
EXIT_BOUND_S = 60.0  # a lost rank is named after a failed collective (~1 s) plus 2 s of heartbeat watching


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("parallel-serve")
    make_tiny_model("llama-gqa-llama3rope", folder, seed=7)
    return folder


def _flags(folder: Path, *extra: str) -> tuple[str, ...]:
    return ("--model-path", str(folder), "--tokenizer-path", str(embedded_model_path()), "--device", "cpu",
            "--dtype", "float32", "--max-total-tokens", "4096", "--decode-log-interval", "2", *extra)


@pytest.fixture(scope="module")
def reference(tiny):
    """64 prompts and their greedy outputs from one device (the offline Engine, which equals transformers)."""
    prompts = random_prompts(64, vocab=320, seed=21)
    engine = tiny_engine(tiny)
    try:
        outputs = engine.generate(input_ids=prompts, sampling_params=_params())
    finally:
        engine.shutdown()
    return prompts, [r["output_ids"] for r in outputs]


def _params() -> dict:
    return {"max_new_tokens": NEW_TOKENS, "temperature": 0.0, "ignore_eos": True}


def _generate(server: ServerProcess, prompts: list[list[int]]) -> list[list[int]]:
    response = requests.post(f"{server.url}/generate", json={"input_ids": prompts, "sampling_params": _params()},
                             timeout=120)
    assert response.status_code == 200, response.text
    return [r["output_ids"] for r in response.json()]


def _rank_pids(server: ServerProcess) -> list[int]:
    """The scheduler processes, in rank order (the log's 'Joined the TP group' lines name their pids)."""
    return [p for p in children_of(server.pid) if "multiprocessing.spawn" in cmdline(p)]


def _joined_pid(text: str, tag: str) -> int:
    return int(re.search(rf"{tag}\] Joined the TP group at [\d.:]+: rank \d of \d \(pid (\d+)\)", text).group(1))


def _wait_exit(proc: subprocess.Popen, seconds: float = EXIT_BOUND_S) -> tuple[int, float]:
    started = time.monotonic()
    code = proc.wait(seconds)
    return code, time.monotonic() - started


def _gone(pids: dict[int, int | None], seconds: float = 10.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(pid, started) for pid, started in pids.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [pid for pid, started in pids.items() if alive(pid, started)]


# ---- tensor parallelism ----

def test_tp2_server_equals_one_device_and_only_tp0_logs_batches(tiny, reference, tmp_path):
    prompts, expected = reference
    log = tmp_path / "tp2.log"
    server = ServerProcess(*_flags(tiny, "--tp-size", "2"), log_file=log).wait_healthy()
    try:
        assert len(_rank_pids(server)) == 2
        assert _generate(server, prompts[:16]) == expected[:16]
        info = requests.get(f"{server.url}/get_server_info", timeout=10).json()
        assert info["tp_size"] == 2 and len(info["dp_replicas"]) == 1
    finally:
        assert server.stop() == 0
    text = log.read_text()
    assert re.search(r" TP0\] Prefill batch\.", text) and re.search(r" TP0\] Decode batch\.", text)
    assert not re.search(r" TP1\] (Prefill|Decode) batch\.", text), "only TP0 writes the batch lines"
    assert re.search(r" TP1\] max_total_num_tokens=4096,", text)


def test_tp2_aborts_and_shutdown_reach_every_rank(tiny, tmp_path):
    """A client that disconnects aborts its request on both ranks; SIGTERM with a stream open aborts it everywhere
    and every rank exits with its pool free."""
    log = tmp_path / "tp2-abort.log"
    server = ServerProcess(*_flags(tiny, "--tp-size", "2", "--max-total-tokens", "8192", "--context-length", "4096"),
                           log_file=log).wait_healthy()
    children = family(server.pid)
    body = {"input_ids": [5, 6, 7, 8], "stream": True,
            "sampling_params": {"max_new_tokens": 3000, "temperature": 0.0, "ignore_eos": True}}
    with requests.post(f"{server.url}/generate", json=body, stream=True, timeout=60) as gone:
        next(gone.iter_lines())  # NOTE: the first chunk: the request runs on both ranks
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        state = requests.get(f"{server.url}/get_server_info", timeout=10).json()["internal_states"][0]
        if state["num_running_reqs"] == 0:
            break
        time.sleep(0.2)
    assert state["num_running_reqs"] == 0, state
    kept = requests.post(f"{server.url}/generate", json=body, stream=True, timeout=60)
    # NOTE: hold the line iterator until the server has stopped: a dropped one closes the connection (urllib3 reads
    # chunked bodies inside its error catcher), and the server would abort the request as a disconnect first
    kept_lines = kept.iter_lines()
    next(kept_lines)
    assert server.stop() == 0
    kept_lines.close()
    kept.close()
    text = log.read_text()
    for tag in ("TP0", "TP1"):
        assert re.search(rf" {tag}\] Scheduler shut down: aborted 1 requests, KV pool free: True", text), text[-3000:]
    assert "memory leak" not in text
    assert not _gone(children)


def test_a_tp_size_that_cannot_split_the_heads_exits_with_the_counts():
    server = ServerProcess("--device", "cpu", "--tp-size", "2", "--max-total-tokens", "2048")
    code, _ = _wait_exit(server.proc, 120)
    output = server.output()
    server.stop()
    assert code != 0
    assert "--tp-size 2: LlamaForCausalLM has 9 attention heads and 3 KV heads" in output, output[-2000:]


def test_killing_a_tp_rank_exits_nonzero_naming_it(tiny, tmp_path):
    log = tmp_path / "kill.log"
    server = ServerProcess(*_flags(tiny, "--tp-size", "2"), log_file=log).wait_healthy()
    children = family(server.pid)
    victim = _joined_pid(log.read_text(), "TP1")
    assert victim in children
    os.kill(victim, signal.SIGKILL)
    code, seconds = _wait_exit(server.proc)
    output = server.output()
    server.stop()
    assert code != 0 and seconds < scaled(EXIT_BOUND_S)
    assert f"TP rank 1 (pid {victim}) was killed by SIGKILL" in output, output[-3000:]
    assert not _gone(children), "a rank outlived the server"


# ---- multi-node ----

def _node_command(tiny: Path, node_rank: int, address: str, *extra: str) -> list[str]:
    return launcher.toolkit_command("serve", *_flags(tiny, "--tp-size", "2", "--nnodes", "2", "--node-rank",
                                                     str(node_rank), "--dist-init-addr", address, *extra))


class Node:
    """`toolkit serve --node-rank 1`: no HTTP, its own session so that stopping it reaches its ranks."""

    def __init__(self, command: list[str], output: Path) -> None:
        self.output_path = output
        self._file = open(output, "w")
        self.proc = subprocess.Popen(command, stdout=self._file, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(15)
        self._file.close()


def _node_zero(tiny: Path, address: str, log: Path, *extra: str) -> ServerProcess:
    port = launcher.free_port()
    command = launcher.serve_command(port, *_flags(tiny, "--tp-size", "2", "--nnodes", "2", "--node-rank", "0",
                                                   "--dist-init-addr", address, *extra), log_file=log)
    return launcher.ServerProcess(command, port, log.with_suffix(".out"))


def test_two_nodes_form_one_tp_group_and_serve_the_same_output(tiny, reference, tmp_path):
    prompts, expected = reference
    address = f"127.0.0.1:{free_port()}"
    node1 = Node(_node_command(tiny, 1, address), tmp_path / "node1.out")
    node0 = _node_zero(tiny, address, tmp_path / "node0.log")
    try:
        node0.wait_healthy(180)
        assert _generate(node0, prompts[:8]) == expected[:8]
        node1_ranks = family(node1.proc.pid)
        assert node0.stop() == 0
        code, seconds = _wait_exit(node1.proc)
        assert code == 0 and seconds < scaled(EXIT_BOUND_S), node1.output()[-2000:]
        assert not _gone(node1_ranks)
    finally:
        node0.stop()
        node1.stop()
    assert "node 0 serves HTTP" in node1.output()
    assert "Listening on" not in node1.output()


def test_a_lost_node_stops_node_zero_naming_the_rank_and_address(tiny, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    node1 = Node(_node_command(tiny, 1, address), tmp_path / "node1.out")
    node0 = _node_zero(tiny, address, tmp_path / "node0.log")
    try:
        node0.wait_healthy(180)
        children = family(node0.pid)
        os.killpg(node1.proc.pid, signal.SIGKILL)
        code, seconds = _wait_exit(node0.proc)
        output = node0.output_tail(200)
    finally:
        node0.stop()
        node1.stop()
    assert code != 0 and seconds < scaled(EXIT_BOUND_S)
    assert f"TP rank 0: lost TP rank 1 of the TP group at {address}" in output, output[-3000:]
    assert not _gone(children)


def test_a_killed_node_launcher_takes_its_ranks_and_the_group_down(tiny, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    node1 = Node(_node_command(tiny, 1, address), tmp_path / "node1.out")
    node0 = _node_zero(tiny, address, tmp_path / "node0.log")
    try:
        node0.wait_healthy(180)
        orphans = family(node1.proc.pid)
        assert orphans
        os.kill(node1.proc.pid, signal.SIGKILL)  # the launcher only: its rank must not outlive it
        code, seconds = _wait_exit(node0.proc)
        left = _gone(orphans)
        output = node0.output_tail(200)
    finally:
        node0.stop()
        node1.stop()
    assert code != 0 and seconds < scaled(EXIT_BOUND_S)
    assert f"TP rank 0: lost TP rank 1 of the TP group at {address}" in output, output[-3000:]
    assert not left, "node 1's rank outlived its launcher"


def test_a_node_that_never_joins_is_named_within_the_timeout(tiny, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    node0 = _node_zero(tiny, address, tmp_path / "node0.log", "--dist-timeout", "5")
    code, seconds = _wait_exit(node0.proc)
    output = node0.output_tail(200)
    node0.stop()
    assert code != 0 and seconds < scaled(EXIT_BOUND_S)
    assert f"TP rank 1 did not join the TP group at {address} within 5 s" in output, output[-3000:]


def test_a_node_without_node_zero_exits_naming_rank_zero_and_the_address(tiny, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    node1 = Node(_node_command(tiny, 1, address, "--dist-timeout", "5"), tmp_path / "node1.out")
    try:
        code, seconds = _wait_exit(node1.proc)
    finally:
        node1.stop()
    assert code != 0 and seconds < scaled(EXIT_BOUND_S)
    assert f"TP rank 1 could not reach TP rank 0 at {address} within 5 s" in node1.output(), node1.output()[-2000:]


# ---- data parallelism ----

@pytest.mark.parametrize("method", ["round_robin", "minimum_tokens"])
def test_dp2_serves_64_concurrent_requests_on_both_replicas(tiny, reference, tmp_path, method):
    prompts, expected = reference
    log = tmp_path / "dp2.log"
    server = ServerProcess(*_flags(tiny, "--dp-size", "2", "--load-balance-method", method, "--enable-metrics"),
                           log_file=log).wait_healthy()
    try:
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            outputs = list(pool.map(lambda p: _generate(server, [p])[0], prompts))
        assert outputs == expected
        metrics = requests.get(f"{server.url}/metrics", timeout=10).text
        info = requests.get(f"{server.url}/get_server_info", timeout=10).json()
    finally:
        assert server.stop() == 0
    finished = {d: float(re.search(rf'sglang:num_requests_total{{dp_rank="{d}",model_name="[^"]+"}} (\S+)',
                                   metrics).group(1)) for d in ("0", "1", "all")}
    assert finished["all"] == 64 == finished["0"] + finished["1"] and finished["0"] > 0 and finished["1"] > 0
    assert [r["dp_rank"] for r in info["dp_replicas"]] == [0, 1] and len(info["internal_states"]) == 2
    text = log.read_text()
    for d in (0, 1):
        assert re.search(rf" DP{d}\] Prefill batch\.", text) and re.search(rf" DP{d}\] Decode batch\.", text), d


def test_a_dead_dp_replica_fails_health_and_the_server_exits_naming_it(tiny, tmp_path):
    log = tmp_path / "dp-kill.log"
    server = ServerProcess(*_flags(tiny, "--dp-size", "2"), log_file=log).wait_healthy()
    children = family(server.pid)
    victim = sorted(_rank_pids(server))[-1]
    os.kill(victim, signal.SIGKILL)
    statuses = server.health_until_exit(10)
    code, _ = _wait_exit(server.proc)
    output = server.output()
    server.stop()
    assert 503 in statuses, statuses[-5:]
    assert code != 0
    assert re.search(rf"TP rank 0 of DP replica [01] \(pid {victim}\) was killed by SIGKILL", output), output[-3000:]
    assert not _gone(children)

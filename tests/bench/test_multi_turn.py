"""Multi-turn chat sessions (issue 31): each turn sends the conversation so far with the server's real replies,
sessions arrive at the controlled rate, turns wait the think time, and cache hits come from the server."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.bench.stub import Script, Served, StubServer, ThreadedStub
from tests.bench.test_cli import bench, records
from toolkit.bench.command import BenchOptions, check_options
from toolkit.bench.conversation import conversation_record, sessions_of
from toolkit.bench.datasets import DatasetSpec, Prompt
from toolkit.bench.options import UsageError
from toolkit.bench.outcome import RequestOutcome

REPLY = Script(ttft=0.01, chunks=((0.0, 1), (0.002, 1), (0.002, 1), (0.002, 1)))
SESSIONS, TURNS, RATE, THINK = 4, 3, 10.0, 0.15


def _user_turns(tmp_path: Path, count: int) -> Path:
    """A custom dataset whose rows start with distinct words, so no two first turns share a prefix."""
    path = tmp_path / "turns.jsonl"
    rows = [{"prompt": f"row{n} please tell me something new", "output_len": 4} for n in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run(tmp_path: Path, threaded_stub, *extra: str) -> tuple[dict, list[Served], str]:
    out = tmp_path / "runs.jsonl"
    with threaded_stub(default=REPLY, prefix_cache=True) as stub:
        result = bench("--base-url", stub.base_url, "--backend", "openai-chat", "--dataset", "custom",
                       "--dataset-path", str(_user_turns(tmp_path, SESSIONS * TURNS)), "--num-prompts", str(SESSIONS),
                       "--turns", str(TURNS), "--think-time", str(THINK), "--rate", str(RATE), "--arrival", "constant",
                       "--warmup-requests", "0", "--output-file", str(out), *extra)
        served = list(stub.served)
    assert result.exit_code == 0, result.output
    return records(out)[0], served, result.output


def _previous(served: list[Served], request: Served) -> Served:
    """The request of the same session one turn earlier: the one whose messages this request's start with."""
    messages = request.body["messages"][:-2]
    return next(s for s in served if s.body["messages"] == messages)


@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory):
    """One run shared by the tests below (the `threaded_stub` fixture is per test)."""
    return _run(tmp_path_factory.mktemp("multi_turn"), lambda **kw: ThreadedStub(StubServer(**kw)))


def test_each_turn_sends_the_conversation_with_the_servers_previous_reply(multi_turn):
    record, served, _ = multi_turn
    assert len(served) == SESSIONS * TURNS and record["completed"] == SESSIONS * TURNS
    later = [s for s in served if len(s.body["messages"]) > 1]
    assert len(later) == SESSIONS * (TURNS - 1)
    for request in later:
        previous = _previous(served, request)
        reply, last = request.body["messages"][-2:]
        assert reply == {"role": "assistant", "content": previous.reply} and previous.reply.strip()
        assert last["role"] == "user" and last["content"] not in [m["content"] for m in previous.body["messages"]]
    assert len({s.reply for s in served}) > 1  # the replies differ, so a turn carries its own session's reply


def test_later_turns_are_served_from_the_prefix_cache_and_first_turns_are_not(multi_turn):
    record, served, output = multi_turn
    assert record["turns"] == TURNS and record["sessions"] == SESSIONS and record["skipped_turns"] == 0
    by_turn = record["by_turn"]
    assert [t["turn"] for t in by_turn] == [1, 2, 3] and all(t["completed"] == SESSIONS for t in by_turn)
    assert by_turn[0]["cached_tokens"] == 0 and record["cache_hit_rate_first_turn"] == 0.0
    assert all(t["cache_hit_rate"] > 0.5 for t in by_turn[1:]) and record["cache_hit_rate_later_turns"] > 0.5
    for request in (s for s in served if len(s.body["messages"]) > 1):
        previous = _previous(served, request)
        assert request.cached_tokens == len(previous.words) + len(previous.reply.split())
    assert all(t["mean_ttft_ms"] > 0 for t in by_turn)
    assert "4 sessions of 3 turns" in output and "turn 2: TTFT" in output


def test_sessions_start_at_the_controlled_rate(multi_turn):
    _, served, _ = multi_turn
    starts = sorted(s.received for s in served if len(s.body["messages"]) == 1)
    assert len(starts) == SESSIONS
    assert np.diff(starts) == pytest.approx([1 / RATE] * (SESSIONS - 1), abs=0.03)


def test_each_turn_waits_the_think_time_after_the_previous_reply(multi_turn):
    _, served, _ = multi_turn
    for request in (s for s in served if len(s.body["messages"]) > 1):
        pause = request.received - _previous(served, request).writes[-1]
        assert THINK - 0.005 <= pause <= THINK + 0.08


def test_multi_turn_needs_a_chat_backend_and_sensible_turns():
    chat = BenchOptions("http://x", backend="openai-chat", turns=3, think_time=0.5)
    check_options(chat)
    cases = {
        "only a chat API": BenchOptions("http://x", backend="sglang", turns=2),
        "--turns must be at least 1": BenchOptions("http://x", backend="openai-chat", turns=0),
        "--think-time must be 0 or more": BenchOptions("http://x", backend="openai-chat", turns=2, think_time=-1),
        "it needs --turns 2 or more": BenchOptions("http://x", backend="openai-chat", think_time=1.0),
        "a trace replays single requests": BenchOptions("http://x", backend="openai-chat", turns=2,
                                                        dataset=DatasetSpec(name="trace")),
    }
    for message, opts in cases.items():
        with pytest.raises(UsageError, match=message):
            check_options(opts)


def test_the_cli_rejects_multi_turn_on_a_completions_backend(threaded_stub):
    with threaded_stub() as stub:
        result = bench("--base-url", stub.base_url, "--backend", "openai", "--turns", "2", "--num-prompts", "1")
        assert result.exit_code == 2 and "only a chat API" in result.output and not stub.served


def test_sessions_group_consecutive_prompts_and_the_record_counts_skipped_turns():
    prompts = [Prompt(f"p{i}", 1, 1) for i in range(7)]
    assert [[p.text for p in s.prompts] for s in sessions_of(prompts, 3)] == [["p0", "p1", "p2"], ["p3", "p4", "p5"]]
    done = RequestOutcome(0, 0.0, 10, sent=1.0, ended=2.0, token_times=[1.5], token_counts=[1], output_len=1,
                          cached_tokens=0, session=0, turn=0)
    failed = RequestOutcome(1, 2.0, 10, sent=2.0, error="timeout", ended=3.0, session=0, turn=1)
    record = conversation_record([done, failed], sessions=1, turns=3, think_time=0.0)
    assert record["skipped_turns"] == 1
    assert [(t["requests"], t["completed"]) for t in record["by_turn"]] == [(1, 1), (1, 0), (0, 0)]
    assert record["by_turn"][0]["mean_ttft_ms"] == pytest.approx(500.0)
    assert record["cache_hit_rate_first_turn"] == 0.0 and record["cache_hit_rate_later_turns"] is None

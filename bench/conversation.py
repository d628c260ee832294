"""Multi-turn chat sessions: how a conversation grows turn by turn, and the per-turn summary of a run.

A session's turn k+1 sends the messages of turn k, the assistant's real reply to it, and the next user message,
so the prefix the server can reuse grows with each turn (what a radix / prefix cache is tuned for).
"""
from __future__ import annotations

from dataclasses import dataclass

from toolkit.bench.datasets import Prompt
from toolkit.bench.metrics import cache_hits, request_metrics
from toolkit.bench.outcome import RequestOutcome


@dataclass(frozen=True, slots=True)
class Session:
    """One conversation: `prompts[k]` is the user message (and output length) of its turn k."""

    index: int
    prompts: list[Prompt]


def sessions_of(prompts: list[Prompt], turns: int) -> list[Session]:
    """Consecutive groups of `turns` prompts, one per session (a short tail is dropped)."""
    count = len(prompts) // turns
    return [Session(i, prompts[i * turns:(i + 1) * turns]) for i in range(count)]


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _mean_ttft_ms(done: list[RequestOutcome]) -> float | None:
    ttfts = [request_metrics(o).ttft for o in done]
    return 1000.0 * sum(ttfts) / len(ttfts) if ttfts else None


def _turn_row(turn: int, outcomes: list[RequestOutcome]) -> dict:
    done = [o for o in outcomes if o.ok]
    return {"turn": turn + 1, "requests": len(outcomes), "completed": len(done),
            "mean_ttft_ms": _mean_ttft_ms(done), **cache_hits(done)}


def conversation_record(outcomes: list[RequestOutcome], sessions: int, turns: int, think_time: float) -> dict:
    """The record's multi-turn fields (schema in `bench.record`); turns are numbered from 1 there."""
    by_turn = [_turn_row(k, [o for o in outcomes if o.turn == k]) for k in range(turns)]
    done = [o for o in outcomes if o.ok]
    return {
        "sessions": sessions,
        "think_time": think_time,
        "skipped_turns": sessions * turns - len(outcomes),
        "by_turn": by_turn,
        "cache_hit_rate_first_turn": cache_hits([o for o in done if o.turn == 0])["cache_hit_rate"],
        "cache_hit_rate_later_turns": cache_hits([o for o in done if o.turn])["cache_hit_rate"],
    }

"""A rank is read once, where a line names it: its name as the log prints it, normalised, and its parts typed."""
from __future__ import annotations

import pytest

from toolkit.diagnose import analyze
from toolkit.diagnose.read.lines import parse_lines
from toolkit.diagnose.read.rank import NO_RANK, Rank, process_rank, rank, rank_name, stats_rank

DECODE = ("Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, "
          "gen throughput (token/s): 4594.01, #queue-req: 317")


@pytest.mark.parametrize("name,parts", [
    ("DP1 TP0", (1, 0, None, None, None)),
    ("DP6 TP6 EP6", (6, 6, None, 6, None)),
    ("DP0 PP1 ATTN_CP0 MOE_DP0 TP2 EP2", (0, 2, 1, 2, None)),
    ("GPU3", (None, None, None, None, 3)),
    ("DP*", (None, None, None, None, None)),
    ("", (None, None, None, None, None)),
])
def test_a_rank_names_its_parts(name: str, parts: tuple) -> None:
    r = rank(name)
    assert r == name and (r.dp, r.tp, r.pp, r.ep, r.gpu) == parts
    assert r.dp_group == (f"DP{parts[0]}" if parts[0] is not None else "")


def test_one_rank_object_per_name() -> None:
    assert rank("DP1 TP0") is rank_name("  DP1   TP0 ") and not NO_RANK and NO_RANK == ""


def test_process_names_and_stats_lines_name_ranks() -> None:
    assert (process_rank("EngineCore_DP1"), process_rank("Worker_PP1_TP0"), process_rank("VllmWorker rank=7"),
            process_rank("APIServer")) == ("DP1", "PP1 TP0", "TP7", "")
    assert stats_rank("Engine 001: Avg prompt throughput: 1.0 tokens/s", NO_RANK).dp == 1
    assert stats_rank("4 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s", NO_RANK) == "DP*"


def test_events_and_tables_carry_typed_ranks(tmp_path) -> None:
    lines = [f"[2025-11-11 04:06:{i:02d} DP1 TP3] {DECODE}" for i in range(12)]
    events = list(parse_lines(lines))
    assert all(type(e.rank) is Rank and (e.rank.dp, e.rank.tp) == (1, 3) for e in events)
    log = tmp_path / "server.log"
    log.write_text("\n".join(lines) + "\n")
    table = analyze([log]).timeline.batches["decode"]
    assert [type(r) for r in table.ranks] == [Rank] and table.ranks[0].tp == 3

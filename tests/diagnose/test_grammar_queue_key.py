"""Our decode line's `#grammar-queue-req` (requests whose grammar is compiling) is a declared batch key: the fast
path reads the line as the per-line parser does, with the count as a field."""
from __future__ import annotations

from toolkit.diagnose.fastpath.scan import scan_chunk
from toolkit.diagnose.fields import parse_fields
from toolkit.diagnose.source import PAD

LINE = ("[2026-12-02 02:16:12] Decode batch. #running-req: 4, #token: 160, token usage: 0.01, cuda graph: False, "
        "gen throughput (token/s): 9.77, #queue-req: 2, #grammar-queue-req: 3")


def test_the_grammar_queue_count_is_read_on_the_fast_path_and_per_line():
    data = bytearray((LINE + "\n").encode()[:-1]) + bytearray(PAD)
    scanned = scan_chunk(data, len(data) - PAD)
    assert not scanned.slow.any() and len(scanned.batch.index) == 1
    fields = parse_fields("decode", LINE.split("] ", 1)[1])
    assert fields["grammar_queue_req"] == 3 and fields["queue_req"] == 2

"""The reading room: everything of `toolkit diagnose` that touches a log's bytes or text, and nothing else.

A log becomes typed records here (`logs.read_logs` -> `series.LogRecords`): events of declared kinds and fields, the
batch lines as columns, each line's time and typed rank read once, the facts a prefix tells as events of their own,
the release the log's forms prove. Each part of the log's grammar is one module with its declaration and its reader:
`prefix` (the line forms, in the order they are tried), `rank`, `messages` (the kinds and how each starts),
`values` (how `key: value` fields are written), `batch` (decode, prefill and stats lines), `requests`, `startup`,
`errors` (what an error record says), `arguments` (the server's arguments as printed), `launch` (a pasted launch
command), `eras`; `fields` gathers every kind's declared fields. `lines` is the per-line parser, `fastpath` the
vectorized reader of the hot lines (compiled from the same declarations), `source` the chunked byte reader, `export`
the `--export` writer. The judging room (`config`, `timeline`, `rules`, ...) reads only what this room hands out
(`tests/diagnose/test_wall.py`).
"""

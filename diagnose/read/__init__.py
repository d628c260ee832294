"""The reading room: everything of `toolkit diagnose` that touches a log's bytes or text, and nothing else.

A log becomes typed records here (`logs.read_logs`): events of declared kinds and fields, the batch lines as
columns, each line's time and rank read once. Each part of the log's grammar is one module holding its declaration
and its reader: `prefix` (stamps, rank tags, what comes before a message), `messages` (the kinds and how each
starts), `batch` (the decode, prefill and stats lines), `fields` (every other message's fields), `launch` (a pasted
launch command), `eras` (the forms that prove an SGLang era). `lines` is the per-line parser, `fastpath` the
vectorized reader of the hot lines (compiled from the same declarations), `source` the chunked byte reader and
`export` the `--export` writer. The judging room (`config`, `timeline`, `rules`, ...) reads only what this room
hands out.
"""

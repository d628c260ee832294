"""The fast path: the common lines of a chunk (decode, prefill and HTTP access lines in the layout SGLang's
logger writes since 0.3.6, also behind a collector's prefix; vLLM's stats lines) classified and read in vectorized
numpy operations (the stats lines, a few in a chunk, one pattern match each);
every other line goes to the per-line parser (`diagnose.read.lines`), in order.

Results equal the per-line parser: for every line it reads, the kind, line number, time, rank and fields are
exactly what `LineParser` and `parse_fields` give, and the counts of other and unread lines are the same
(docs/log-formats.md §14). Both derive their tables from `diagnose.read` (stamp layout and rank tags,
labels, keys, the binding usage). Tests that check it: `tests/diagnose/test_log_format_differential.py` (every
sample line of docs/log-formats.md, every real log), `tests/diagnose/test_fastpath.py` (every era, every stamp and
body, cut and garbled lines, random pieces and access lines, the calendar, byte ranges read by worker
processes, the export, timelines and findings of whole logs), `tests/diagnose/test_scan.py` (line bounds,
more layouts than templates, more key sequences than groups, each value form at the short-number steps' limits,
ranges whose last line runs past their end) and `tests/diagnose/test_chunks.py` (chunks scanned ahead on threads
equal chunks scanned one by one).

- `words`: bytes read eight at a time (SWAR) from any offset of a chunk;
- `outer`: the outer prefixes (docker compose, CRI, Ray, journald) read past before a line's stamp;
- `scan`: which lines are hot (matched against a chunk's few layouts), their kind, time and rank;
- `fields`: the `key: value` pieces of hot decode and prefill lines, walked in groups of one key sequence;
- `access`: the fields of hot access lines (for `--export`);
- `stats`: vLLM's stats lines in their common form, read one pattern match each;
- `plain`: which slow lines are plain, told from their bytes where they are the commonest plain lines;
- `ahead`: chunks scanned on worker threads, or byte ranges of a large file in worker processes, while the
  caller consumes earlier ones.
"""

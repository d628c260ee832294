"""The log formats `toolkit diagnose` reads, declared once (docs/log-formats.md): both readers derive from here.

- `prefix`: the time, rank and process prefix before a message: stamp grammars, the stamp -> seconds rule,
  rank tags and how they are named;
- `messages`: the message names (event kinds), how each message starts, which ones span several lines;
- `batch`: the decode and prefill lines: their labels, field keys with types, the binding pool usage;
- `eras`: SGLang's eras and the log forms that prove them.

The per-line parser (`diagnose.prefix`, `diagnose.messages`, `diagnose.fields`, `diagnose.lines`) compiles
these into regexes; the fast path (`diagnose.fastpath`) compiles them into byte tables at import.
"""

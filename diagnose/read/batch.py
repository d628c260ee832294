"""SGLang's decode and prefill lines (docs/log-formats.md §2-§3, §8): labels, field keys, the binding usage.

`Decode batch. #running-req: 233, #token: 370959, token usage: 0.82, ...`: after the label, an unordered
`key: value` list. The per-line parser reads any key (`diagnose.read.fields`); the fast path reads lines whose keys
are all in `KEYS` and sends the rest to it.
"""
from __future__ import annotations

from typing import Literal

DECODE_LABEL = "Decode batch"
PREFILL_LABEL = "Prefill batch"
NEW_FILL_LABEL = "new fill batch"  # SGLang 0.1's prefill line
LABELS = (DECODE_LABEL, PREFILL_LABEL, NEW_FILL_LABEL)
LABEL_ENDS = ".,"  # a label ends in `.` (to 0.5.3) or `,` (from 0.5.5), or ` [iter]` before it
RUNNING = "#running-req"   # every decode line prints it; a prefill line too, except on a PD prefill server
QUEUE = "#queue-req"
ACCEPT_LENGTH = "accept len"  # speculative decoding's accepted tokens per step (decode lines)
MIXED = f"(mixed {RUNNING}: "  # 0.3's `Prefill batch(mixed #running-req: N).`

FieldType = Literal["count", "ratio", "rate", "bool"]

# Every key the fast path reads, as printed, with its type: `count` an integer, `ratio` a fraction (`12.50%`
# reads 0.125), `rate` a decimal, `bool` `True`/`False`. No key is a prefix of another.
KEYS: dict[str, FieldType] = {
    RUNNING: "count", "#running_req": "count", QUEUE: "count",
    "#token": "count", "#full token": "count", "#gpu token": "count",
    "token usage": "ratio", "full token usage": "ratio", "gpu token usage": "ratio",
    "swa token usage": "ratio", "#swa token": "count", "#cpu token": "count", "cpu token usage": "ratio",
    "mamba usage": "ratio", "mamba num": "count",
    "cuda graph": "bool", "npu graph": "bool", "cpu graph": "bool", "musa graph": "bool",
    "gen throughput (token/s)": "rate", "input throughput (token/s)": "rate",
    "#new-seq": "count", "#new-token": "count", "#cached-token": "count", "cache hit rate": "ratio",
    "#pending-token": "count", ACCEPT_LENGTH: "rate", "accept rate": "ratio", "pre-allocated usage": "ratio",
    "#retracted-req": "count", "#prealloc-req": "count", "#transfer-req": "count", "#inflight-req": "count",
    "#bootstrap-req": "count", "#optimistic-req": "count", "#unbootstrapped-req": "count",
    "#transferring-req": "count", "#replay-token": "count", "cap len": "count", "block accept len": "rate",
    "#host-receive-req": "count", "waiting-image-req": "count",
}
# Per-pool usages (hybrid SWA / mamba models), canonical names: `token_usage` is their maximum, the binding one.
USAGES = ("token_usage", "swa_token_usage", "mamba_usage")
BINDING_USAGE = "token_usage"

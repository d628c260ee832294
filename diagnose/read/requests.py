"""Lines about requests (docs/log-formats.md §2, §6.1, §6.3-§6.4, §9.2): uvicorn's access line, load shedding and
clients giving up, requests refused as too long, a PD transfer that failed, vLLM V0's preemption warning, SGLang's
retraction; each kind's fields.
"""
from __future__ import annotations

import re

from toolkit.diagnose.read.messages import ACCESS_FIELDS
from toolkit.diagnose.read.values import PAIRS, Fields, Number, Value, message, pairs, value

_ACCESS = re.compile(ACCESS_FIELDS)


def _access(text: str) -> dict[str, Value]:
    m = _ACCESS.search(text)
    if m is None:
        return {}
    return {"client": m["client"], "method": m["method"], "path": m["path"], "status": int(m["status"])}


# -- load shedding and clients giving up (docs/log-formats.md §6.4) -----------------------------------

_SHED = re.compile(r"Shed (\d{1,20}) requests? (?:in the last (\d{1,20}) s )?\(503, Retry-After (\d{1,10}) s\): ?(.*)")
_QUEUE_TIMEOUT = re.compile(r"Queue timeout: aborted (\d{1,20}) requests? that waited more than ([\d.]{1,20}) s"
                            r"(?:, #queue-req: (\d{1,20}))?")
_CLIENT_OF = re.compile(r"the client of ([A-Z]{1,10}) (\S{1,2000}) disconnected")


def _shed(text: str) -> dict[str, Value]:
    """`shed` (requests refused since the last line), `seconds` since it (absent on the first), `retry_after`,
    and the count per reason (`queue_full`, `waiting_timeout`)."""
    m = _SHED.match(text)
    if m is None:
        return {}
    out: dict[str, Value] = {"shed": int(m.group(1)), "retry_after": int(m.group(3))}
    if m.group(2) is not None:
        out["seconds"] = int(m.group(2))
    out.update({k: v for k, v in pairs(m.group(4)).items() if isinstance(v, int)})
    return out


_INPUT_TOO_LONG = re.compile(r"Input length \((\d+)(?: tokens)?\) exceeds the maximum allowed length \((\d+)")


def _input_too_long(text: str) -> dict[str, Value]:
    m = _INPUT_TOO_LONG.match(text)
    return {"input_len": int(m.group(1)), "max_input_len": int(m.group(2))} if m else {}


# vLLM V0's scheduler: `Input prompt (N tokens) is too long and exceeds limit of M` (a warning; the request is
# dropped: it finishes with no output). M is V0's prompt limit (docs/log-formats.md §9).
_PROMPT_TOO_LONG = re.compile(r"Input prompt \((\d{1,12}) tokens\) is too long and exceeds limit of (\d{1,12})")


def _prompt_too_long(text: str) -> dict[str, Value]:
    m = _PROMPT_TOO_LONG.match(text)
    return {"prompt_len": int(m.group(1)), "prompt_limit": int(m.group(2))} if m else {}


def _queue_timeout(text: str) -> dict[str, Value]:
    m = _QUEUE_TIMEOUT.match(text)
    if m is None:
        return {}
    out: dict[str, Value] = {"aborted": int(m.group(1)), "waited_s": value(m.group(2))}
    if m.group(3) is not None:
        out["queue_req"] = int(m.group(3))
    return out


def _client_gone(text: str) -> dict[str, Value]:
    m = _CLIENT_OF.match(text)
    return {"method": m.group(1), "path": m.group(2)} if m else _message(text)


_TRANSFER = re.compile(r"(Prefill|Decode) transfer failed for request (?:rank=(\d+) )?(?:.*?rid='([^']*)')?.*?"
                       r"(?: with exception (?:\w+\([^()]*\): )?(.*))?$")


# vLLM V0's KV connectors on the decode side: `[rank0]: Failed to receive all KVs and hidden states, redo model
# forwarding.` (no request named: the whole batch is recomputed)
_NOT_RECEIVED = re.compile(r"(?:\[rank(\d+)\]: )?Failed to receive all KVs and hidden states,? ?(.*?)\.?$")


def _transfer_failed(text: str) -> dict[str, Value]:
    """`Prefill transfer failed for request rank=4 req.rid='ab' req.bootstrap_room=9 with exception
    KVTransferError(bootstrap_room=9): Decode instance could be dead, ...`: the side, rank, request and why."""
    m = _TRANSFER.match(text)
    if m is None:
        return _not_received(text)
    side, rank, rid, reason = m.groups()
    out: dict[str, Value] = {"side": side.lower()}
    if rank is not None:
        out["transfer_rank"] = int(rank)
    if rid is not None:
        out["rid"] = rid
    if reason:
        out["reason"] = reason.strip()
    return out


def _not_received(text: str) -> dict[str, Value]:
    m = _NOT_RECEIVED.match(text)
    if m is None:
        return {}
    rank, then = m.groups()
    out: dict[str, Value] = {"side": "decode", "reason": "not all KV received" + (f", {then}" if then else "")}
    if rank is not None:
        out["transfer_rank"] = int(rank)
    return out


# -- vLLM V0's preemption warning (docs/log-formats.md §9.2) ----------------------------------------

_PREEMPT = re.compile(r"Sequence group (\S{1,200}) is preempted (?:by|in) (?:PreemptionMode\.)?(\w{1,20}) mode")
_RESUMED = re.compile(r"Preempted request (\S{1,200}) has been resumed")
_CUMULATIVE = re.compile(r"total_(?:num_)?cumulative_preemption(?:_cnt)?=(\d{1,20})")


def _preempt(text: str) -> dict[str, Value]:
    out: dict[str, Value] = {}
    m = _PREEMPT.search(text)
    if m is not None:
        out.update(request=m.group(1), mode=m.group(2).lower())
    resumed = _RESUMED.search(text)
    if resumed is not None:
        out.update(request=resumed.group(1), resumed=True)
    c = _CUMULATIVE.search(text)
    if c is not None:
        out["cumulative_preemptions"] = int(c.group(1))
    return out


FIELDS: dict[str, Fields] = {
    "access": Fields(_access, {"client": str, "method": str, "path": str, "status": int}),
    "retract": PAIRS,
    "shed": Fields(_shed, {"shed": int, "retry_after": int, "seconds": int}, open=True),  # and a count per reason
    "queue_timeout": Fields(_queue_timeout, {"aborted": int, "waited_s": Number, "queue_req": int}),
    "input_too_long": Fields(_input_too_long, {"input_len": int, "max_input_len": int}),
    "prompt_too_long": Fields(_prompt_too_long, {"prompt_len": int, "prompt_limit": int}),
    "client_gone": Fields(_client_gone, {"method": str, "path": str, "message": str}),
    "kv_transfer_failed": Fields(_transfer_failed, {"side": str, "transfer_rank": int, "rid": str, "reason": str}),
    "preempt": Fields(_preempt, {"request": str, "mode": str, "resumed": bool, "cumulative_preemptions": int}),
}

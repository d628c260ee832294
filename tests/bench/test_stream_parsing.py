"""Streams become timed token events: HTTP chunk framing, SSE framing, each backend's JSON, per-token counts."""
from __future__ import annotations

import json

import pytest

from toolkit.bench.accounting import reconcile, token_counts
from toolkit.bench.backends import RequestOptions, StreamTokens, read_tokens, request_body
from toolkit.bench.datasets import Prompt
from toolkit.bench.http import dechunk
from toolkit.bench.sse import StreamError, split_events


def _chunked(*payloads: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in payloads) + b"0\r\n\r\n"


def test_dechunk_stamps_each_chunk_with_the_read_that_completed_it():
    raw = _chunked(b"data: 1\n\n", b"data: 22\n\n", b"data: 333\n\n")
    reads = [raw[:5], raw[5:20], raw[20:31], raw[31:]]
    times, payloads = dechunk([1.0, 2.0, 3.0, 4.0], reads)
    assert payloads == [b"data: 1\n\n", b"data: 22\n\n", b"data: 333\n\n"]
    assert times == [2.0, 3.0, 4.0]


def test_dechunk_waits_for_the_last_chunk_and_reads_extensions():
    raw = _chunked(b"abc")
    assert dechunk([1.0], [raw[:-2]]) is None
    assert dechunk([1.0], [b"3;ext=1\r\nabc\r\n0\r\n\r\n"]) == ([1.0], [b"abc"])
    with pytest.raises(ValueError):
        dechunk([1.0], [b"zz\r\nabc\r\n0\r\n\r\n"])


def test_sse_events_are_stamped_when_their_last_byte_arrives():
    chunks = [b'data: {"a": 1}\n\ndata: {"a"', b': 2}\n', b'\n: keep-alive\n\ndata: [DONE]\n\n',
              b'data: {"after": "done"}\n\n']
    assert split_events([1.0, 2.0, 3.0, 4.0], chunks) == [(1.0, {"a": 1}), (3.0, {"a": 2})]


def test_sse_accepts_crlf_multiline_data_and_a_missing_done():
    chunks = [b'data: {"a":\r\n', b'data: 1}\r\n\r', b'\nevent: x\r\ndata:{"b": 2}\r\n\r\n']
    assert split_events([1.0, 2.0, 3.0], chunks) == [(3.0, {"a": 1}), (3.0, {"b": 2})]
    events = split_events([1.0, 2.0], [b'data: {"a": 1}\r\n\r\n', b'data: {"b": 2}'])
    assert events == [(1.0, {"a": 1}), (2.0, {"b": 2})]


def test_malformed_sse_is_a_stream_error():
    with pytest.raises(StreamError) as caught:
        split_events([1.0], [b'data: {"a": 1}\n\ndata: {not json\n\n'])
    assert caught.value.kind == "malformed_response"


def test_request_bodies_per_backend():
    prompt = Prompt("hello world", 2, 16, input_ids=[5, 6])
    native = json.loads(request_body(prompt, RequestOptions("sglang", None, True, {})))
    assert native == {"input_ids": [5, 6], "stream": True,
                      "sampling_params": {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True}}
    text = json.loads(request_body(Prompt("hi", 1, 3), RequestOptions("sglang", None, False, {})))
    assert text["text"] == "hi" and text["sampling_params"]["ignore_eos"] is False
    completion = json.loads(request_body(prompt, RequestOptions("openai", "m", True, {})))
    assert completion["prompt"] == "hello world" and completion["model"] == "m"
    assert completion["max_tokens"] == 16 and completion["stream"] and completion["ignore_eos"]
    assert completion["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    chat = json.loads(request_body(prompt, RequestOptions("openai-chat", "m", False, {})))
    assert chat["messages"] == [{"role": "user", "content": "hello world"}] and "ignore_eos" not in chat


def test_extra_request_body_merges_one_level_deep():
    extra = {"sampling_params": {"temperature": 0.7}, "rid": "x"}
    body = json.loads(request_body(Prompt("a", 1, 4), RequestOptions("sglang", None, True, extra)))
    assert body["sampling_params"] == {"temperature": 0.7, "max_new_tokens": 4, "ignore_eos": True}
    assert body["rid"] == "x"
    body = json.loads(request_body(Prompt("a", 1, 4), RequestOptions("openai", "m", True,
                                                                     {"stream_options": {"include_usage": True}})))
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_sglang_native_counts_tokens_from_cumulative_meta_info():
    events = [(1.0, {"text": " a", "meta_info": {"prompt_tokens": 7, "completion_tokens": 1}}),
              (2.0, {"text": " a b c", "meta_info": {"prompt_tokens": 7, "completion_tokens": 3}}),
              (2.5, {"text": " a b c", "meta_info": {"prompt_tokens": 7, "completion_tokens": 3}}),
              (3.0, {"text": " a b c d", "meta_info": {"prompt_tokens": 7, "completion_tokens": 4}})]
    tokens = read_tokens("sglang", events)
    assert tokens.times == [1.0, 2.0, 3.0] and tokens.counts == [1, 2, 1]
    assert tokens.texts == [" a", " b c", " d"]
    assert (tokens.prompt_tokens, tokens.completion_tokens) == (7, 4)


def test_openai_streams_use_continuous_usage_and_skip_role_and_usage_chunks():
    def usage(n):
        return {"prompt_tokens": 5, "completion_tokens": n}

    chat = [(1.0, {"choices": [{"delta": {"role": "assistant"}}], "usage": usage(0)}),
            (2.0, {"choices": [{"delta": {"content": " x y"}}], "usage": usage(2)}),
            (3.0, {"choices": [{"delta": {"reasoning_content": " r", "content": ""}}], "usage": usage(3)}),
            (3.5, {"choices": [{"delta": {}, "finish_reason": "length"}], "usage": usage(3)}),
            (4.0, {"choices": [], "usage": usage(3)})]
    tokens = read_tokens("openai-chat", chat)
    assert (tokens.times, tokens.counts, tokens.texts) == ([2.0, 3.0], [2, 1], [" x y", " r"])
    completions = [(1.0, {"choices": [{"text": " a"}]}), (2.0, {"choices": [{"text": " b c"}]}),
                   (3.0, {"choices": [], "usage": usage(3)})]
    tokens = read_tokens("openai", completions)
    assert tokens.counts == [None, None] and tokens.completion_tokens == 3 and tokens.prompt_tokens == 5


def test_an_error_event_is_a_server_error():
    with pytest.raises(StreamError) as caught:
        read_tokens("openai", [(1.0, {"error": {"message": "boom", "code": 500}})])
    assert caught.value.kind == "server_error" and "boom" in str(caught.value)


def test_reconcile_keeps_proportions_and_hits_the_total():
    assert reconcile([1, 1, 1], 3) == [1, 1, 1]
    assert reconcile([1, 2, 1], 8) == [2, 4, 2]
    assert sum(reconcile([1, 3, 2, 2], 11)) == 11
    assert reconcile([], 0) == []


def test_without_server_counts_the_tokenizer_splits_chunks_and_usage_sets_the_total(embedded_tokenizer):
    tokens = StreamTokens([1.0, 2.0, 3.0], [None, None, None], [" the", " and of", " in to the"], 4, None)
    assert token_counts(tokens, embedded_tokenizer) == ([1, 2, 3], 6)
    tokens.completion_tokens = 12
    assert token_counts(tokens, embedded_tokenizer) == ([2, 4, 6], 12)
    known = StreamTokens([1.0, 2.0], [1, 3], [" a", " b"], None, None)
    assert token_counts(known, None) == ([1, 3], 4)

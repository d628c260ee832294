"""SGLang-native endpoints: /generate, /health, /health_generate, /model_info and /server_info (also under their
older names /get_model_info, /get_server_info), /get_load, /flush_cache, /metrics. sglang-router registers a worker
from /server_info and /model_info (`model_path`, `served_model_name`, `tokenizer_path`, `is_generation`), probes
/health and reads /get_load for load-aware policies (docs/fleets-and-overload.md)."""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

from aiohttp import web

from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server import generation
from toolkit.runtime.server.admission import queued
from toolkit.runtime.server.generation import Choice
from toolkit.runtime.server.protocol import RequestError, parse_generate
from toolkit.runtime.server.sse import parse_request, sse_response
from toolkit.runtime.server.state import STATE, ServerState
from toolkit.runtime.server.tokenizer_manager import Chunk, SchedulerGone
from toolkit.runtime.server_args import redacted
from toolkit.version import __version__

HEALTH_GENERATE_TIMEOUT = 20.0
FLUSH_CACHE_TIMEOUT = 10.0


def _meta(choice: Choice, return_logprob: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": choice.rid,
        "prompt_tokens": choice.prompt_tokens,
        "completion_tokens": choice.completion_tokens,
        "cached_tokens": choice.cached_tokens,
        "finish_reason": choice.finished_reason.to_json() if choice.finished_reason else None,
        "e2e_latency": time.perf_counter() - choice.started,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [[lp, token, None] for token, lp, _ in choice.logprobs]
        if any(top for _, _, top in choice.logprobs):
            meta["output_top_logprobs"] = [[[v, t, None] for t, v in top or []] for _, _, top in choice.logprobs]
        if choice.prompt_logprobs:
            meta["input_token_logprobs"] = [[lp, token, None] for token, lp, _ in choice.prompt_logprobs]
    return meta


def _result(choice: Choice, return_logprob: bool) -> dict[str, Any]:
    return {"text": choice.text, "output_ids": choice.token_ids, "meta_info": _meta(choice, return_logprob)}


async def generate(request: web.Request) -> web.StreamResponse:
    state: ServerState = request.app[STATE]
    plan = await parse_request(request, parse_generate, state.validation)
    if plan.stream:
        def event(choice: Choice, chunk: Chunk) -> dict[str, Any]:
            # NOTE: SGLang streams the cumulative text and ids so far, not deltas.
            return _result(choice, plan.return_logprob)

        return await sse_response(request, state, plan, event, head={})
    choices = await generation.collect(state.manager, plan)
    results = [_result(c, plan.return_logprob) for c in choices]
    return web.json_response(results[0] if plan.single and len(results) == 1 else results)


async def health(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    if dead := state.dead_replicas():
        return web.Response(status=503, text=f"the scheduler of DP replica {', '.join(map(str, dead))} is not running")
    if not state.healthy or state.manager.failure is not None:
        return web.Response(status=503, text="the scheduler process is not running")
    return web.Response(text="")


async def health_generate(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    if not state.healthy:
        return web.Response(status=503, text="the scheduler process is not running")
    params = SamplingParams(max_new_tokens=1, temperature=0.0)
    try:
        async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT):
            async for _ in state.manager.generate([state.ready.vocab_size // 2], params):
                pass
    except (SchedulerGone, TimeoutError) as exc:
        return web.Response(status=503, text=f"generation failed: {exc or 'timeout'}")
    return web.Response(text="")


def _model_path(state: ServerState) -> str:
    """What the model is registered under: --model-path, or the served name for the embedded model."""
    return state.args.model_path or state.served_model_name


async def get_model_info(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    return web.json_response({
        "model_path": _model_path(state), "tokenizer_path": state.tokenizer_path,
        "served_model_name": state.served_model_name, "is_generation": True, "preferred_sampling_params": None,
        "weight_version": "default", "has_image_understanding": False, "has_audio_understanding": False,
        "architectures": [state.ready.model_class], "model_class": state.ready.model_class,
        "context_len": state.ready.context_len, "vocab_size": state.ready.vocab_size,
    })


async def get_server_info(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    args = {**state.ready.server_args, "api_key": redacted(state.args.api_key)}
    return web.json_response({
        **args,
        "model_path": _model_path(state),
        "served_model_name": state.served_model_name,
        "tokenizer_path": state.tokenizer_path,
        "version": __version__,
        "max_total_num_tokens": state.ready.max_total_num_tokens,
        "max_running_requests": state.ready.max_running_requests,
        "context_len": state.ready.context_len,
        "attention_backend": state.ready.attention_backend,
        "internal_states": [asdict(replica.stats) for replica in state.manager.replicas],
        "num_pending_http_requests": len(state.manager.states),
        "dp_replicas": _replicas(state),
    })


def _replicas(state: ServerState) -> list[dict[str, Any]]:
    """Each DP replica (one without --dp-size): its pool, whether its processes run, the load sent to it."""
    alive = state.replicas_alive()
    return [{
        "dp_rank": replica.dp_rank, "alive": alive[replica.dp_rank],
        "max_total_num_tokens": replica.ready.max_total_num_tokens if replica.ready else None,
        "max_running_requests": replica.ready.max_running_requests if replica.ready else None,
        "open_requests": replica.load.open_requests, "open_tokens": replica.load.open_tokens,
        "num_running_reqs": replica.stats.num_running_reqs,
        "num_queue_reqs": replica.stats.num_queue_reqs,
    } for replica in state.manager.replicas]


async def get_load(request: web.Request) -> web.Response:
    """Each DP replica's load, as sglang-router reads it: requests open on it (`num_reqs`), those waiting to be
    scheduled (`num_waiting_reqs`, the estimate --max-queued-requests checks), KV tokens in use (`num_tokens`)."""
    state: ServerState = request.app[STATE]
    return web.json_response([{
        "dp_rank": replica.dp_rank,
        "num_reqs": replica.load.open_requests,
        "num_running_reqs": replica.stats.num_running_reqs,
        "num_waiting_reqs": queued(replica.load.open_requests, replica.stats.num_running_reqs),
        "num_tokens": replica.stats.num_used_tokens,
    } for replica in state.manager.replicas])


async def flush_cache(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    try:
        flushed = await state.manager.flush_cache(FLUSH_CACHE_TIMEOUT)
    except TimeoutError:
        raise SchedulerGone(f"the scheduler did not answer within {FLUSH_CACHE_TIMEOUT:.0f} s; retry later") from None
    if not flushed:
        raise RequestError(400, "Cache not flushed: there are running or queued requests; retry when idle.")
    return web.Response(text="Cache flushed.\n")


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE]
    if state.metrics is None:
        raise RequestError(404, "metrics are disabled; start the server with --enable-metrics", code="not_found")
    return web.Response(body=state.metrics.render(), content_type="text/plain", charset="utf-8")



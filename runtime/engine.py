"""The offline, in-process API, SGLang-style: `Engine(model_path=..., **server_args).generate(...)`."""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from toolkit.runtime.launch import launch_scheduler
from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.io_struct import FinishReason, GenerateInput, TokenOutput, context_length_error, token_id_error
from toolkit.runtime.server_args import ServerArgs

Prompt = str | list[str] | None
InputIds = list[int] | list[list[int]] | None


@dataclass
class _Pending:
    rid: str
    params: SamplingParams
    start: float
    return_logprob: bool
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    last: TokenOutput | None = None


def strip_stop_string(text: str, finish: FinishReason | None) -> str:
    """Output text ends before the stop string that finished it (OpenAI and SGLang semantics)."""
    if finish is not None and finish.kind == "stop" and isinstance(finish.matched, str):
        position = text.find(finish.matched)
        if position != -1:
            return text[:position]
    return text


class Engine:
    def __init__(self, model_path: str | None = None, **kwargs: Any) -> None:
        self.server_args = ServerArgs(model_path=model_path, **kwargs)
        configure_logging(self.server_args.log_level, self.server_args.log_file)
        launched = launch_scheduler(self.server_args)
        self.server_args = launched.args
        self.tokenizer = launched.tokenizer
        self.runner = launched.runner
        self.scheduler = launched.scheduler

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: InputIds = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
    ) -> dict | list[dict]:
        """Greedy or sampled completions; a single prompt gives a dict, a list of prompts a list."""
        batch_ids, single = self._tokenize(prompt, input_ids)
        params_list = self._sampling_params(sampling_params, len(batch_ids))
        pending: list[_Pending] = []
        for ids, params in zip(batch_ids, params_list):
            error = token_id_error(ids, self.runner.config.vocab_size) or context_length_error(
                len(ids), params.max_new_tokens, self.scheduler.context_len)
            if error is not None:
                raise ValueError(error)
            for _ in range(params.n):
                pending.append(self._submit(ids, params, return_logprob, top_logprobs_num))
        self._run_until_done(pending, budget=sum(len(ids) for ids in batch_ids) + sum(p.params.max_new_tokens for p in pending))
        results = [self._result(p) for p in pending]
        return results[0] if single and len(results) == 1 else results

    def _tokenize(self, prompt: Prompt, input_ids: InputIds) -> tuple[list[list[int]], bool]:
        if (prompt is None) == (input_ids is None):
            raise ValueError("pass exactly one of prompt or input_ids")
        if prompt is not None:
            prompts = [prompt] if isinstance(prompt, str) else list(prompt)
            return [self.tokenizer.encode(p) for p in prompts], isinstance(prompt, str)
        if input_ids and isinstance(input_ids[0], int):
            return [list(input_ids)], True
        return [list(ids) for ids in input_ids], False

    @staticmethod
    def _sampling_params(sampling_params: dict | list[dict] | None, count: int) -> list[SamplingParams]:
        if isinstance(sampling_params, list):
            if len(sampling_params) != count:
                raise ValueError(f"got {len(sampling_params)} sampling_params for {count} prompts")
            return [SamplingParams.from_dict(p) for p in sampling_params]
        return [SamplingParams.from_dict(sampling_params)] * count

    def _submit(self, ids: list[int], params: SamplingParams, return_logprob: bool, top_logprobs_num: int) -> _Pending:
        rid = uuid.uuid4().hex
        self.scheduler.add_request(GenerateInput(rid, ids, params, return_logprob, top_logprobs_num))
        return _Pending(rid, params, time.perf_counter(), return_logprob)

    def _run_until_done(self, pending: list[_Pending], budget: int) -> None:
        by_rid = {p.rid: p for p in pending}
        unfinished = set(by_rid)
        # NOTE: every step either finishes work or makes a token; retraction can re-prefill, hence the slack.
        max_steps = 4 * budget + 1000
        for _ in range(max_steps):
            for out in self.scheduler.step():
                state = by_rid.get(out.rid)
                if state is None:
                    continue
                self._record(state, out)
                if out.finished_reason is not None:
                    unfinished.discard(out.rid)
            if not unfinished:
                self.scheduler.drain()  # NOTE: an overlapped step may still hold a finished request's KV
                return
        raise RuntimeError(f"the engine did not finish {len(unfinished)} requests within {max_steps} steps")

    @staticmethod
    def _record(state: _Pending, out: TokenOutput) -> None:
        if out.token_id is not None:
            state.output_ids.append(out.token_id)
            if out.logprob is not None:
                state.logprobs.append(out.logprob)
            if out.top_logprobs is not None:
                state.top_logprobs.append(out.top_logprobs)
        state.last = out

    def _result(self, state: _Pending) -> dict:
        last = state.last
        text = self.tokenizer.decode(state.output_ids, skip_special_tokens=state.params.skip_special_tokens)
        meta = {
            "id": state.rid,
            "prompt_tokens": last.prompt_tokens,
            "completion_tokens": last.completion_tokens,
            "cached_tokens": last.cached_tokens,
            "finish_reason": last.finished_reason.to_json(),
            "e2e_latency": time.perf_counter() - state.start,
        }
        if state.return_logprob:
            meta["output_token_logprobs"] = [(lp, tid) for lp, tid in zip(state.logprobs, state.output_ids)]
            if state.top_logprobs:
                meta["output_top_logprobs"] = state.top_logprobs
        return {"text": strip_stop_string(text, last.finished_reason), "output_ids": state.output_ids,
                "meta_info": meta}

    def check_memory(self) -> bool:
        """Idle integrity check (free + cached == pool size, nothing locked)."""
        return self.scheduler.check_memory()

    def flush_cache(self) -> bool:
        return self.scheduler.flush_cache()

    def shutdown(self) -> None:
        if self.scheduler is not None:
            self.scheduler.shutdown()
        self.scheduler = None
        self.runner = None

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

"""The offline, in-process API, SGLang-style: `Engine(model_path=..., **server_args).generate(...)`.

With `tp_size` > 1 this process is TP rank 0 and the other ranks are spawned scheduler processes that follow it
(`server.scheduler_process`): every loop iteration, the messages the engine queued are shared with them before
any rank applies them, then every rank runs the same step.
"""
from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from toolkit.runtime.distributed.group import DistributedError
from toolkit.runtime.distributed.processes import RankProcesses
from toolkit.runtime.distributed.topology import local_ranks
from toolkit.runtime.io_struct import (
    AbortRequest,
    DrainRequest,
    FinishReason,
    FlushCacheRequest,
    GenerateInput,
    ShutdownRequest,
    TokenOutput,
    context_length_error,
    token_id_error,
)
from toolkit.runtime.launch import launch_scheduler
from toolkit.runtime.logging_setup import configure_logging
from toolkit.runtime.sampling.sampling_params import SamplingParams
from toolkit.runtime.server_args import ServerArgs

FOLLOWER_EXIT_TIMEOUT = 30.0

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
    input_logprobs: list | None = None
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
        args = self.server_args = ServerArgs(model_path=model_path, **kwargs)
        if args.dp_size > 1 or args.nnodes > 1:
            raise ValueError("--dp-size and --nnodes need `toolkit serve`; the offline Engine runs one TP group on "
                             "this host")
        ranks = local_ranks(args)
        configure_logging(args.log_level, args.log_file, rank_tag=ranks[0].tag)
        self._inbox: list[object] = []
        self._live: set[str] = set()
        self._threads = torch.get_num_threads()
        self.followers: RankProcesses | None = None
        if args.tp_size > 1:
            from toolkit.runtime.server.scheduler_process import run_scheduler_process

            self.followers = RankProcesses(ranks[1:], run_scheduler_process,
                                           lambda rank: (args, None, os.getpid(), rank)).start()
        try:
            launched = launch_scheduler(args, rank=ranks[0],
                                        peers_dead=self.followers.first_exit if self.followers else None)
        except BaseException:
            self._stop_followers(0.0)
            raise
        self.server_args = launched.args
        self.tokenizer = launched.tokenizer
        self.runner = launched.runner
        self.scheduler = launched.scheduler
        self.tp = launched.tp
        self._group_lost: str | None = None  # why the TP group broke, once it has

    def generate(
        self,
        prompt: Prompt = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: InputIds = None,
        return_logprob: bool = False,
        top_logprobs_num: int = 0,
        logprob_start_len: int = -1,
    ) -> dict | list[dict]:
        """Greedy or sampled completions; a single prompt gives a dict, a list of prompts a list. With
        `return_logprob` and `logprob_start_len` >= 0, also the prompt's logprobs from that position
        (`meta_info.input_token_logprobs`, SGLang's: the first prompt token's is None)."""
        batch_ids, single = self._tokenize(prompt, input_ids)
        params_list = self._sampling_params(sampling_params, len(batch_ids))
        pending: list[_Pending] = []
        for ids, params in zip(batch_ids, params_list):
            error = token_id_error(ids, self.runner.config.vocab_size) or context_length_error(
                len(ids), params.max_new_tokens, self.scheduler.context_len)
            if error is not None:
                raise ValueError(error)
            for _ in range(params.n):
                pending.append(self._submit(ids, params, return_logprob, top_logprobs_num, logprob_start_len))
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

    def _submit(self, ids: list[int], params: SamplingParams, return_logprob: bool, top_logprobs_num: int,
                logprob_start_len: int = -1) -> _Pending:
        rid = uuid.uuid4().hex
        self._inbox.append(GenerateInput(rid, ids, params, return_logprob, top_logprobs_num, logprob_start_len))
        self._live.add(rid)
        return _Pending(rid, params, time.perf_counter(), return_logprob)

    def _iterate(self) -> tuple[list[TokenOutput], list[object]]:
        """One loop iteration: the queued messages (shared with the other TP ranks first), then one step."""
        if self._group_lost is not None:
            raise DistributedError(self._group_lost)
        messages, self._inbox = self._inbox, []
        try:
            if self.tp is not None:
                messages = self.tp.share(messages)
            results = [self.scheduler.handle(message) for message in messages]
            outputs = self.scheduler.step()
        except DistributedError as exc:
            self._group_lost = str(exc)
            raise
        self._live.difference_update(o.rid for o in outputs if o.finished_reason is not None)
        return outputs, [r for r in results if r is not None]

    def _run_until_done(self, pending: list[_Pending], budget: int) -> None:
        by_rid = {p.rid: p for p in pending}
        unfinished = set(by_rid)
        # NOTE: every step either finishes work or makes a token; retraction can re-prefill, hence the slack.
        max_steps = 4 * budget + 1000
        steps = 0
        while steps < max_steps:
            outputs, _ = self._iterate()
            # NOTE: a step that only waited for grammars to compile does not count (compiles have their own bound)
            steps += 0 if self.scheduler.only_compiling else 1
            for out in outputs:
                state = by_rid.get(out.rid)
                if state is None:
                    continue
                self._record(state, out)
                if out.finished_reason is not None:
                    unfinished.discard(out.rid)
            if not unfinished:
                self._inbox.append(DrainRequest())  # NOTE: an overlapped step may still hold a finished request's KV
                self._iterate()
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
        if out.input_logprobs is not None:
            state.input_logprobs = out.input_logprobs
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
            if state.input_logprobs is not None:
                meta["input_token_logprobs"] = [(lp, tid) for tid, lp, _ in state.input_logprobs]
                meta["input_top_logprobs"] = [top for _, _, top in state.input_logprobs]
        return {"text": strip_stop_string(text, last.finished_reason), "output_ids": state.output_ids,
                "meta_info": meta}

    def check_memory(self) -> bool:
        """Idle integrity check (free + cached == pool size, nothing locked)."""
        return self.scheduler.check_memory()

    def flush_cache(self) -> bool:
        self._inbox.append(FlushCacheRequest())
        _, results = self._iterate()
        return results[-1].ok

    def shutdown(self) -> None:
        if self.scheduler is None:
            return
        if self.tp is not None and self._group_lost is not None:
            # NOTE: a broken group is left at once: draining would wait on a step that waits on a lost rank.
            self.scheduler.worker.close()
            self.tp.abandon()
            self._stop_followers(0.0)
        else:
            if self.tp is not None:
                self._leave_group()
            self.scheduler.shutdown()
            if self.tp is not None:
                self.tp.close()
                self._stop_followers(FOLLOWER_EXIT_TIMEOUT)
        torch.set_num_threads(self._threads)
        self.scheduler = None
        self.runner = None

    def _leave_group(self) -> None:
        """Stop every rank at the same iteration: a shutdown the followers apply (they abort what is live and exit
        once idle), with the same aborts here."""
        self._inbox = [ShutdownRequest()]
        for _ in range(10_000):
            messages, self._inbox = self._inbox, []
            self.tp.share(messages)
            for rid in self._live:
                self.scheduler.handle(AbortRequest(rid))
            self._live.clear()
            self.scheduler.step()
            if not self.scheduler.has_work:
                return
        raise RuntimeError("the TP group did not stop within 10000 steps")

    def _stop_followers(self, timeout: float) -> None:
        if self.followers is not None and not self.followers.join(timeout):
            self.followers.kill()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

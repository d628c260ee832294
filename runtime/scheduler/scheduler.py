"""Continuous batching with SGLang's semantics: prefill batches built by the admission adder take priority,
otherwise the running batch decodes; retraction when the KV pool runs dry; an integrity check when idle.

`step()` is one iteration of SGLang's event loop. It does no I/O: the offline Engine calls it directly and the
server's scheduler process calls it between reading requests from and writing outputs to the front end.

With overlap scheduling a decode step is launched before the previous one's tokens are processed, so the host work
(appending tokens, stop checks, outputs, admission) hides behind the forward. A step in flight is drained first
whenever the next decision needs its tokens: before admitting a prefill, before retracting, and when a running
request uses penalties or a grammar (its next mask needs its last token). A request that finished in the step being processed has one more token computed in the
step already launched; that token is dropped and its KV kept for the prefix cache.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from toolkit.runtime.constrained.backend import GrammarBackend
from toolkit.runtime.constrained.bitmask import batch_mask
from toolkit.runtime.constrained.grammar_queue import GrammarQueue, Resolved
from toolkit.runtime.forward_batch import ForwardMode
from toolkit.runtime.io_struct import (
    INVALID_GRAMMAR,
    WAITING_TIMEOUT,
    AbortRequest,
    DrainRequest,
    FinishReason,
    FlushCacheRequest,
    FlushCacheResult,
    GenerateInput,
    SchedulerStats,
    TokenOutput,
    context_length_error,
    logit_bias_error,
    token_id_error,
)
from toolkit.runtime.memory.planning import default_max_running_requests
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.model_worker import LaunchedStep, ModelWorker, OverlapWorker, StepInput
from toolkit.runtime.sampling.prompt_logprobs import PromptRows, PromptSpan, entries
from toolkit.runtime.sampling.sampler import Sampler, SampleOutput, SamplingBatch, TokenHistory
from toolkit.runtime.scheduler.cache_manager import CacheManager
from toolkit.runtime.scheduler.new_token_ratio import NewTokenRatio
from toolkit.runtime.scheduler.policy import SchedulePolicy
from toolkit.runtime.scheduler.prefill_adder import AddReqResult, PrefillAdder, never_fits
from toolkit.runtime.scheduler.request import Req, ReqStatus, check_statuses
from toolkit.runtime.scheduler.retraction import RETRACT_DECODE_STEPS, choose_victims
from toolkit.runtime.scheduler.schedule_batch import ScheduleBatch
from toolkit.runtime.scheduler.stats_log import StatsLogger
from toolkit.runtime.server_args import ResolvedArgs

logger = logging.getLogger("runtime")

_QUEUED = frozenset({ReqStatus.WAITING, ReqStatus.RETRACTED})
_IN_RUNNING_BATCH = frozenset({ReqStatus.RUNNING, ReqStatus.FINISHED, ReqStatus.ABORTED})
_CHUNKED = frozenset({ReqStatus.PREFILLING})
GRAMMAR_IDLE_WAIT_S = 0.005  # with only compiling grammars to wait for, a step blocks this long on them


@dataclass
class _Launched:
    """A step handed to the model worker, with the requests it ran (in batch order) and how."""

    batch: ScheduleBatch
    reqs: list[Req]
    step: LaunchedStep
    prompt_spans: list[PromptSpan] = field(default_factory=list)  # whose prompt tokens its `PromptRows` score


class Scheduler:
    def __init__(
        self,
        args: ResolvedArgs,
        runner: ModelRunner,
        eos_token_ids: frozenset[int] = frozenset(),
        decode_text: Callable[[list[int]], str] | None = None,
        grammar_backend: GrammarBackend | None = None,
    ) -> None:
        self.args = args
        self.runner = runner
        self.eos_token_ids = eos_token_ids
        self.decode_text = decode_text
        self.context_len = runner.context_len
        self.max_total_num_tokens = runner.max_total_num_tokens
        self.cache = CacheManager(runner.req_to_token_pool, runner.allocator, radix_cache=not args.disable_radix_cache)
        self.policy = SchedulePolicy(args.schedule_policy, self.cache, seed=args.random_seed or 0)
        self.ratio = NewTokenRatio.from_conservativeness(args.schedule_conservativeness)
        self.max_running_requests = args.max_running_requests or default_max_running_requests(
            self.max_total_num_tokens, self.context_len)
        self.chunked_prefill_size = args.chunked_prefill_size if args.chunked_prefill_enabled else None
        self.waiting: list[Req] = []
        self.running = ScheduleBatch([])
        self.chunked_req: Req | None = None
        self.sampler = Sampler(runner.device)
        self.overlap = not args.disable_overlap_schedule
        self.worker = (OverlapWorker if self.overlap else ModelWorker)(runner, self.sampler)
        self._inflight: _Launched | None = None
        self.stats_log = StatsLogger(self.max_total_num_tokens, args.decode_log_interval,
                                     writes_batch_lines=runner.tp is None or runner.tp.is_leader)
        self._outputs: list[TokenOutput] = []
        self._checked_since_idle = True
        self._aborts_pending = False
        self.grammar_backend = grammar_backend
        self.grammar_queue = GrammarQueue(grammar_backend, args.grammar_compile_timeout) if grammar_backend else None
        self.compiling: dict[str, Req] = {}  # requests in the grammar queue, in arrival order
        # NOTE: under TP only rank 0 samples; the other ranks advance their matchers but build no masks.
        self._fills_masks = runner.tp is None or runner.tp.is_leader
        logger.info(
            f"max_total_num_tokens={self.max_total_num_tokens}, chunked_prefill_size={args.chunked_prefill_size}, "
            f"max_prefill_tokens={args.max_prefill_tokens}, max_running_requests={self.max_running_requests}, "
            f"context_len={self.context_len}, {runner.mem_key}={runner.avail_after_pool:.2f} GB"
        )

    # ---- requests in ----
    def handle(self, message: object) -> FlushCacheResult | None:
        """Apply one message from the front end (under TP: rank 0's, on every rank in the same order)."""
        if isinstance(message, GenerateInput):
            self.add_request(message)
        elif isinstance(message, AbortRequest):
            self.abort_request(message.rid)
        elif isinstance(message, FlushCacheRequest):
            return FlushCacheResult(self.flush_cache())
        elif isinstance(message, DrainRequest):
            self._drain()
        return None

    def add_request(self, inp: GenerateInput) -> None:
        req = Req(
            rid=inp.rid, origin_input_ids=list(inp.input_ids), sampling_params=inp.sampling_params,
            eos_token_ids=self.eos_token_ids, return_logprob=inp.return_logprob,
            top_logprobs_num=inp.top_logprobs_num, tail_text=self.decode_text,
            logprob_start_len=inp.logprob_start_len if inp.return_logprob else -1,
        )
        vocab_size = self.runner.config.vocab_size
        error = token_id_error(req.origin_input_ids, vocab_size) or context_length_error(
            len(req.origin_input_ids), req.sampling_params.max_new_tokens, self.context_len
        ) or logit_bias_error(req.sampling_params, vocab_size)
        if error is not None:
            self._finish_unscheduled(req, error)
            return
        spec = req.sampling_params.grammar
        if spec is None:
            self.waiting.append(req)
        elif self.grammar_queue is None:
            self._finish_unscheduled(req, f"{spec.label}: constrained decoding is off (--grammar-backend none)",
                                     INVALID_GRAMMAR)
        else:
            req.grammar = self.grammar_queue.submit(req.rid, spec, at_once=self.runner.tp is None)
            if req.grammar is None:
                self.compiling[req.rid] = req
            else:
                self.waiting.append(req)

    def _admit_compiled(self) -> None:
        """Requests whose grammar is ready join the waiting queue; those whose grammar was refused finish. Under TP,
        rank 0 decides which and every rank applies its verdicts (a follower waits for its own compile)."""
        tp = self.runner.tp
        if tp is None:
            resolved = self.grammar_queue.ready()
        elif tp.is_leader:
            resolved = self.grammar_queue.ready()
            tp.share([(r.rid, r.error) for r in resolved])
        else:
            resolved = [self.grammar_queue.resolve(rid, error) for rid, error in tp.share([])]
        for item in resolved:
            self._leave_grammar_queue(self.compiling.pop(item.rid), item)

    def _leave_grammar_queue(self, req: Req, item: Resolved) -> None:
        if item.error is not None:
            self._finish_unscheduled(req, item.error, INVALID_GRAMMAR)
            return
        req.grammar = item.grammar
        self.waiting.append(req)

    def abort_request(self, rid: str, message: str = "aborted by the client") -> None:
        for req in self._live_requests():
            if req.rid == rid and not req.finished:
                req.to_abort = message
                self._aborts_pending = True

    def _live_requests(self) -> list[Req]:
        live = self.waiting + list(self.compiling.values()) + self.running.reqs
        live += self._inflight.reqs if self._inflight else []
        return live + [self.chunked_req] if self.chunked_req is not None else live

    # ---- the loop ----
    @property
    def only_compiling(self) -> bool:
        """The only work left is requests waiting for their grammar to compile."""
        return bool(self.compiling) and not (self.waiting or self.running.reqs or self.chunked_req or self._inflight)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running.reqs or self.chunked_req or self._inflight or self.compiling)

    def step(self) -> list[TokenOutput]:
        """Run one prefill or decode batch if there is one (with overlap, also process the one before it);
        otherwise finish the step in flight, or do the idle checks."""
        if self._needs_drain():
            self._drain()
        if self._aborts_pending:
            self._apply_aborts()
        if self.compiling:
            self._admit_compiled()
        if self.args.queue_timeout is not None and self.waiting:
            self._abort_on_queue_timeout(time.perf_counter())
        batch = self._next_batch()
        if batch is None:
            self._drain()
            if self.only_compiling:
                self.grammar_queue.wait(GRAMMAR_IDLE_WAIT_S)
        else:
            self._checked_since_idle = False
            self._launch(batch)
        if not self.has_work:
            # NOTE: idle as of now (SGLang checks on every idle turn of its loop): the ratio resets before the next
            # request arrives, even one that arrives while the server waits for messages.
            self._on_idle()
        outputs, self._outputs = self._outputs, []
        return outputs

    def shutdown(self) -> None:
        """Finish the step in flight and stop the model worker (and the grammar compiler)."""
        self.drain()
        self.worker.close()
        if self.grammar_queue is not None:
            self.grammar_queue.close()

    def drain(self) -> list[TokenOutput]:
        """Process the step in flight, if any: afterwards every finished request's KV is back in the cache."""
        self._drain()
        outputs, self._outputs = self._outputs, []
        return outputs

    def _needs_drain(self) -> bool:
        """The next decision needs the in-flight step's tokens: it was a prefill (its requests join the running
        batch when processed), admission may run, or a running request uses penalties (they count every token)."""
        if self._inflight is None:
            return False
        if self._inflight.batch.mode is ForwardMode.EXTEND:
            return True
        admits = (self.waiting and not (self.running.batch_is_full and self.running.reqs)) or self.chunked_req
        return bool(admits) or any(r.penalized or r.grammar is not None for r in self.running.reqs)

    def _drain(self) -> None:
        launched, self._inflight = self._inflight, None
        if launched is not None:
            self._process(launched)

    def _next_batch(self) -> ScheduleBatch | None:
        batch = self._new_prefill_batch()
        if batch is not None:
            return batch
        if self.running.is_empty:
            return None
        return self._update_running_batch()

    def _launch(self, batch: ScheduleBatch) -> None:
        """Hand the batch to the model worker; without overlap, process it at once, with overlap, process the
        step launched before it (the worker runs them in order)."""
        forward_batch = batch.forward_batch(self.cache.req_to_token, self.runner)
        if batch.mode is ForwardMode.DECODE:
            step = StepInput(forward_batch, self._sampling(batch.reqs), input_segments=batch.decode_inputs.tokens)
        else:
            producing = [i for i, r in enumerate(batch.reqs) if r.is_chunked == 0]
            reqs = [batch.reqs[i] for i in producing]
            sampling = self._sampling(reqs) if reqs else None
            last_rows = batch.logit_rows()
            rows = None
            if len(producing) != len(batch.reqs) or len(last_rows) != sum(batch.logit_counts):
                rows = _rows([last_rows[i] for i in producing], forward_batch.input_ids.device)
            prompt_rows, spans = _prompt_rows(batch, last_rows, forward_batch.input_ids.device)
            step = StepInput(forward_batch, sampling, sample_rows=rows, prompt_rows=prompt_rows)
        launched = _Launched(batch, list(batch.reqs), self.worker.launch(step))
        if batch.mode is ForwardMode.EXTEND:
            launched.prompt_spans = spans
        self._after_launch(launched)
        previous, self._inflight = self._inflight, launched
        if previous is not None:
            self._process(previous)
        if not self.overlap:
            self._drain()

    def _after_launch(self, launched: _Launched) -> None:
        """Every request of the step has one more token on the way; the next decode step reads it from here."""
        batch = launched.batch
        if batch.mode is ForwardMode.DECODE:
            for row, req in enumerate(launched.reqs):
                req.inflight += 1
                req.token_source = (launched.step, row)
            batch.decode_inputs = batch.decode_inputs.advanced(launched.step)
            return
        row = 0
        for req in launched.reqs:
            if req.is_chunked == 0:
                req.inflight += 1
                req.token_source = (launched.step, row)
                row += 1

    def _process(self, launched: _Launched) -> None:
        sample, used_cuda_graph = launched.step.wait()
        if launched.batch.mode is ForwardMode.EXTEND:
            if sample.prompt_logprobs is not None:
                _gather_prompt_logprobs(launched.prompt_spans, sample.prompt_logprobs)
            self._process_prefill(launched.batch, sample)
        else:
            self._process_decode(launched.reqs, sample, used_cuda_graph)

    def _sampling(self, reqs: list[Req]) -> SamplingBatch:
        batch = self._choice(reqs)
        if self.grammar_backend is not None and self._fills_masks:
            batch.vocab_mask = batch_mask(self.grammar_backend, [r.grammar for r in reqs], self.runner.device)
        return batch

    def _choice(self, reqs: list[Req]) -> SamplingBatch:
        if all(r.plain_greedy for r in reqs):
            return SamplingBatch.greedy(len(reqs), self.runner.device)
        histories = None
        if any(r.sampling_params.has_penalties for r in reqs):
            histories = [TokenHistory(r.origin_input_ids, r.output_ids) for r in reqs]
        logprob_rows = [i for i, r in enumerate(reqs) if r.return_logprob]
        return SamplingBatch.build(
            [r.sampling_params for r in reqs], [r.rid for r in reqs], self.runner.device, histories,
            logprob_rows or None, max((r.top_logprobs_num for r in reqs), default=0),
        )

    # ---- prefill ----
    def _new_prefill_batch(self) -> ScheduleBatch | None:
        # NOTE: an empty running batch is never full: with nothing running the whole pool is admissible.
        full = self.running.batch_is_full and not self.running.is_empty
        if (full or not self.waiting) and self.chunked_req is None:
            return None
        running_bs = len(self.running)
        mixed = self.args.enable_mixed_chunk and not self.running.is_empty
        adder = PrefillAdder(
            self.cache, self.running.reqs, self.ratio.value,
            self.args.max_prefill_tokens, self.chunked_prefill_size, running_bs if mixed else 0,
            self.max_running_requests,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input()
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        self._admit_waiting(adder)
        if not adder.can_run_list:
            self._abort_if_never_fits()
            return None
        return self._build_prefill_batch(adder, running_bs, mixed)

    def _admit_waiting(self, adder: PrefillAdder) -> None:
        prefix_matched = self.policy.sort(self.waiting) if adder.has_request_slot else False
        for req in self.waiting:
            if not prefix_matched and adder.has_request_slot:
                self.cache.match_prefix(req)
            result = adder.add_one_req(req)
            if result is not AddReqResult.CONTINUE:
                # NOTE: no admission is retried until the running batch shrinks (SGLang's batch_is_full).
                self.running.batch_is_full = result in (AddReqResult.NO_TOKEN, AddReqResult.NO_REQUEST_SLOT)
                break

    def _build_prefill_batch(self, adder: PrefillAdder, running_bs: int, mixed: bool) -> ScheduleBatch:
        admitted = set(map(id, adder.can_run_list))
        self.waiting = [r for r in self.waiting if id(r) not in admitted]
        for req in adder.can_run_list:
            req.status = ReqStatus.PREFILLING
        if adder.new_chunked_req is not None:
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1
        used, usage = self._token_usage()
        self.stats_log.log_prefill(
            len(adder.can_run_list), adder.log_input_tokens, adder.log_hit_tokens, used, usage,
            running_bs, len(self.waiting),
        )
        batch = ScheduleBatch(list(adder.can_run_list))
        batch.prepare_for_extend(self.cache)
        if mixed:
            self._drop_from_running()
            if not self.running.is_empty:
                self.running.prepare_for_decode(self.cache)
                batch.mix_with_running(self.running)
                self.running = ScheduleBatch([])
        return batch

    def _abort_if_never_fits(self) -> None:
        """With nothing running and nothing locked, a head request that does not fit the pool never will."""
        if not self.running.is_empty or self.chunked_req is not None or not self.waiting:
            return
        if self.cache.protected_size() > 0:
            return
        error = never_fits(self.waiting[0], self.max_total_num_tokens)
        if error is not None:
            self._finish_unscheduled(self.waiting.pop(0), error)

    def _process_prefill(self, batch: ScheduleBatch, sample: SampleOutput) -> None:
        producing = [r for r in batch.reqs if r.is_chunked == 0]
        decoding = set(map(id, batch.decoding_reqs))
        for row, req in enumerate(producing):
            req.inflight -= 1
            if req.max_new_tokens == 0:
                self._finish_scored(req)
            else:
                self._append_token(req, sample, row)
            if req.finished or id(req) not in decoding:
                self.cache.cache_req(req, finished=req.finished)
        if self.chunked_req is not None:
            # NOTE: between chunks the request keeps its row and the slots of every chunk so far.
            self.chunked_req.is_chunked -= 1
            self.cache.cache_req(self.chunked_req, finished=False)
        batch.filter([r for r in batch.reqs if not r.finished and r is not self.chunked_req])
        for req in batch.reqs:
            req.status = ReqStatus.RUNNING
        self.running.merge(batch)
        self.running.mode = ForwardMode.DECODE

    # ---- decode ----
    def _update_running_batch(self) -> ScheduleBatch | None:
        self._drop_from_running()
        if self.running.is_empty:
            return None
        if not self._check_decode_mem():
            self._drain()  # NOTE: retraction needs every token of the requests it re-queues
            self._drop_from_running()
            if self.running.is_empty:
                return None
            if not self._check_decode_mem():
                self._retract()
                if not self._check_decode_mem():
                    self._abort_lone_request()
                    return None
        else:
            self.ratio.step_decay()
        self.running.prepare_for_decode(self.cache)
        return self.running

    def _drop_from_running(self, keep: list[Req] | None = None) -> None:
        """Remove finished (or all but `keep`) requests; a smaller batch may admit again."""
        before = len(self.running)
        self.running.filter(keep)
        if len(self.running) < before:
            self.running.batch_is_full = False

    def _check_decode_mem(self) -> bool:
        page_size = self.cache.page_size
        return self.cache.make_room(self.running.new_pages_next_decode(page_size) * page_size)

    def _retract(self) -> None:
        reqs = self.running.reqs
        old_ratio = self.ratio.value

        def release(req: Req, remaining: int) -> None:
            self.cache.release(req)
            req.reset_for_retract()
            shortfall = remaining * RETRACT_DECODE_STEPS - self.cache.available_size()
            if shortfall > 0:
                self.cache.evict(shortfall)

        kept, retracted = choose_victims(reqs, self.cache.available_size, release)
        if not retracted:
            return
        self._drop_from_running([reqs[i] for i in kept])
        self.ratio.set_after_retraction(self.running.reqs)
        self.stats_log.log_retraction(len(retracted), old_ratio, self.ratio.value)
        self.waiting.extend(reqs[i] for i in retracted)

    def _abort_lone_request(self) -> None:
        for req in self.running.reqs:
            req.to_abort = (
                "the KV pool is full and this request alone cannot fit its next token; raise --max-total-tokens "
                "or lower max_new_tokens"
            )
            self._finish_running(req)
        self._drop_from_running()

    def _process_decode(self, reqs: list[Req], sample: SampleOutput, used_cuda_graph: bool) -> None:
        kept = 0
        for row, req in enumerate(reqs):
            req.inflight -= 1
            if req.finished:
                # NOTE: it finished (or was aborted) after this step launched: the token is dropped, and the
                # request's KV, now complete, goes to the cache once no step in flight holds it.
                if req.inflight == 0:
                    self.cache.cache_req(req, finished=True)
                continue
            kept += 1
            self._append_token(req, sample, row)
            if req.finished and req.inflight == 0:
                self.cache.cache_req(req, finished=True)
        if self.stats_log.on_decode_step(kept):
            used, usage = self._token_usage()
            self.stats_log.log_decode(len(reqs), used, usage, cuda_graph=used_cuda_graph, queue=len(self.waiting),
                                      grammar_queue=len(self.compiling))
        self._drop_from_running()

    # ---- tokens out ----
    def _append_token(self, req: Req, sample: SampleOutput, row: int) -> None:
        token = sample.token_ids[row]
        req.output_ids.append(token)
        if req.first_token_time is None:
            req.first_token_time = time.perf_counter()
        logprob = top = None
        if req.return_logprob and sample.logprobs is not None:
            logprob = sample.logprobs[row]
            req.output_logprobs.append(logprob)
            if req.top_logprobs_num and sample.top_logprobs is not None:
                top = sample.top_logprobs[row][: req.top_logprobs_num]
                req.output_top_logprobs.append(top)
        if req.grammar is not None and not req.grammar.accept(token):
            reason = FinishReason("abort", message=f"the grammar does not allow the token {token} the model chose")
        else:
            reason = req.finish_after(token)
        if reason is not None:
            req.finish(reason)
        self._emit(req, token, logprob, top, self._prompt_logprobs(req) if len(req.output_ids) == 1 else None)

    def _finish_scored(self, req: Req) -> None:
        """max_new_tokens 0 (a prompt scored, not continued): the prefill's token is dropped."""
        req.finish(FinishReason("length", matched=0))
        self._emit(req, None, prompt=self._prompt_logprobs(req))

    @staticmethod
    def _prompt_logprobs(req: Req) -> list | None:
        if req.logprob_start_len < 0:
            return None
        head = [(req.origin_input_ids[0], None, None)] if req.logprob_start_len == 0 else []
        return head + req.input_logprobs

    def _emit(self, req: Req, token: int | None, logprob: float | None = None, top=None, prompt=None) -> None:
        if req.finished:
            self.sampler.forget(req.rid)
        self._outputs.append(TokenOutput(
            req.rid, token, req.finished_reason, len(req.origin_input_ids), len(req.output_ids), req.cached_tokens,
            logprob, top, prompt,
        ))

    # ---- aborts ----
    def _apply_aborts(self) -> None:
        self._aborts_pending = False
        for req in [r for r in self.waiting if r.to_abort]:
            self.waiting.remove(req)
            self._finish_unscheduled(req, req.to_abort)
        for req in [r for r in self.compiling.values() if r.to_abort]:
            del self.compiling[req.rid]
            self.grammar_queue.remove(req.rid)
            self._finish_unscheduled(req, req.to_abort)
        for req in [r for r in self.running.reqs if r.to_abort]:
            self._finish_running(req)
        self._drop_from_running()
        chunked = self.chunked_req
        if chunked is not None and chunked.to_abort:
            self.chunked_req = None
            self.cache.release(chunked)
            self._finish_unscheduled(chunked, chunked.to_abort)

    def _abort_on_queue_timeout(self, now: float) -> None:
        """SGLang's waiting timeout: a request still waiting for its first schedule after --queue-timeout seconds
        is aborted (the front end answers it 503); one summary line per step that times any out."""
        limit = self.args.queue_timeout
        expired = [r for r in self.waiting if r.first_token_time is None and now - r.created_time > limit]
        if not expired:
            return
        gone = set(map(id, expired))
        self.waiting = [r for r in self.waiting if id(r) not in gone]
        message = f"the request waited more than {limit:g} s in the queue (--queue-timeout); retry later"
        for req in expired:
            req.finish(FinishReason("abort", message=message, code=WAITING_TIMEOUT))
            self._emit(req, None)
        logger.info(f"Queue timeout: aborted {len(expired)} requests that waited more than {limit:g} s, "
                    f"#queue-req: {len(self.waiting)}")

    def _finish_running(self, req: Req) -> None:
        req.check_finished()
        if req.inflight == 0:  # else the step in flight still writes its KV: released when it is processed
            self.cache.cache_req(req, finished=True)
        self._emit(req, None)

    def _finish_unscheduled(self, req: Req, message: str, code: str | None = None) -> None:
        req.finish(FinishReason("abort", message=message, code=code))
        logger.info(f"Abort request {req.rid}: {message}")
        self._emit(req, None)

    def check_statuses(self) -> None:
        """Raise AssertionError if a request's status disagrees with where the scheduler holds it (between steps;
        a finished request stays in the running batch until it is filtered)."""
        check_statuses(self.waiting, _QUEUED, "the waiting queue")
        check_statuses(self.running.reqs, _IN_RUNNING_BATCH, "the running batch")
        check_statuses([self.chunked_req] if self.chunked_req else [], _CHUNKED, "the chunked request")

    # ---- idle ----
    def _on_idle(self) -> None:
        self.ratio.reset()
        if not self._checked_since_idle:
            self._checked_since_idle = True
            self.check_memory()

    def check_memory(self) -> bool:
        """SGLang's idle integrity check: every slot is free or cached, nothing is locked or held."""
        ok = self.cache.is_idle_clean()
        if not ok:
            cache = self.cache
            self.stats_log.log_memory_leak(cache.available_size(), cache.evictable_size(), cache.protected_size())
        return ok

    def flush_cache(self) -> bool:
        if self.has_work:
            return False
        self.cache.flush()
        return True

    def _token_usage(self) -> tuple[int, float]:
        return self.stats_log.token_usage(self.cache.available_size(), self.cache.evictable_size())

    @property
    def stats(self) -> SchedulerStats:
        stats = self.stats_log.stats
        # NOTE: a request that finished while a step holding it is in flight still holds its KV: it counts.
        releasing = sum(1 for r in self._inflight.reqs if r.finished) if self._inflight else 0
        stats.num_running_reqs = len(self.running) + (1 if self.chunked_req else 0) + releasing
        stats.num_queue_reqs = len(self.waiting)
        stats.num_grammar_queue_reqs = len(self.compiling)
        stats.num_used_tokens, usage = self._token_usage()
        stats.token_usage = round(usage, 4)
        stats.new_token_ratio = self.ratio.value
        return stats


def _rows(indices: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(indices, dtype=torch.int64, device=device)


def _prompt_rows(batch: ScheduleBatch, last_rows: list[int],
                 device: torch.device) -> tuple[PromptRows | None, list[PromptSpan]]:
    """The extend's logits rows that score prompt tokens: request i's last `logit_counts[i]` positions, those
    followed by a prompt token (its last position of the prompt only samples)."""
    rows: list[int] = []
    targets: list[int] = []
    spans: list[PromptSpan] = []
    for req, prefix_len, ids, count, last in zip(batch.reqs, batch.prefix_lens, batch.new_token_ids,
                                                 batch.logit_counts, last_rows):
        if count == 1 and not req.wants_prompt_logprobs:
            continue
        start = prefix_len + len(ids) - count  # the position of the request's first logits row
        first = max(start, max(req.logprob_start_len, 1) - 1)
        end = min(prefix_len + len(ids), len(req.origin_input_ids) - 1)  # positions [first, end) score a token
        if end <= first:
            continue
        row0 = last - count + 1
        rows += range(row0 + first - start, row0 + end - start)
        targets += req.origin_input_ids[first + 1 : end + 1]
        spans.append(PromptSpan(req, first + 1, end - first))
    if not rows:
        return None, []
    top = max(s.req.top_logprobs_num for s in spans)
    return PromptRows(_rows(rows, device), _rows(targets, device), top), spans


def _gather_prompt_logprobs(spans: list[PromptSpan], scores: list) -> None:
    offset = 0
    for span in spans:
        req = span.req
        req.input_logprobs += entries(req.origin_input_ids, span.first, scores[offset : offset + span.count],
                                      req.top_logprobs_num)
        offset += span.count

"""Runs one scheduled batch on the model: resolve its input tokens, forward, sample.

`ModelWorker` runs a step when it is launched, so the scheduler waits for each one. `OverlapWorker` (SGLang's
overlap scheduler) runs steps on a thread of its own, in launch order: while step N runs, the scheduler processes
step N-1's tokens and prepares step N+1. A step's sampled tokens stay on the device and feed the next step's input
directly (`InputSegment`), so no host round trip sits between two decode steps; the host reads them with one
(non-blocking) copy when it processes the step.
"""
from __future__ import annotations

import atexit
import logging
import queue
import threading
from dataclasses import dataclass, field

import torch

from toolkit.runtime.forward_batch import ForwardBatch
from toolkit.runtime.model_runner import ModelRunner
from toolkit.runtime.sampling.prompt_logprobs import PromptRows, PromptScores, score
from toolkit.runtime.sampling.sampler import SampledTokens, Sampler, SampleOutput, SamplingBatch, to_host

logger = logging.getLogger("runtime")


@dataclass
class InputSegment:
    """A run of a batch's input tokens taken from an earlier step's sampled tokens (rows `index`, or all)."""

    source: LaunchedStep
    index: torch.Tensor | None = None


@dataclass
class StepInput:
    batch: ForwardBatch
    sampling: SamplingBatch | None  # None: nothing to sample (every request is a prefill chunk with more to come)
    sample_rows: torch.Tensor | None = None  # logits rows to sample, None for all
    # Where the input ids come from when `batch.input_ids` is None: earlier steps' tokens, in batch order.
    input_segments: list[InputSegment] = field(default_factory=list)
    prompt_rows: PromptRows | None = None  # logits rows scoring prompt tokens (an extend's prompt logprobs)


class LaunchedStep:
    """A step handed to the worker: its tokens on the device once it ran, its host result on `wait()`."""

    def __init__(self, step: StepInput) -> None:
        self.step = step
        self.tokens: torch.Tensor | None = None
        self._sampled: SampledTokens | None = None
        self._prompt_scores: PromptScores | None = None
        self._host_copy: torch.Tensor | None = None
        self._ready: torch.cuda.Event | None = None
        self._used_cuda_graph = False
        self._done = threading.Event()
        self._error: BaseException | None = None

    def wait(self) -> tuple[SampleOutput, bool]:
        """The sampled tokens (and logprobs) as host lists, and whether the forward replayed a graph."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        if self._ready is not None:
            self._ready.synchronize()
        sampling = self.step.sampling
        if sampling is None or self._sampled is None:
            out = SampleOutput([])
        else:
            self._sampled.token_ids = self._host_copy
            out = to_host(self._sampled, sampling)
        if self._prompt_scores is not None:
            out.prompt_logprobs = self._prompt_scores.to_host()
        return out, self._used_cuda_graph


class ModelWorker:
    """Runs each step as it is launched."""

    def __init__(self, runner: ModelRunner, sampler: Sampler) -> None:
        self.runner = runner
        self.sampler = sampler

    def launch(self, step: StepInput) -> LaunchedStep:
        launched = LaunchedStep(step)
        self._run(launched)
        return launched

    def close(self) -> None:
        pass

    def _run(self, launched: LaunchedStep) -> None:
        try:
            with torch.inference_mode():
                self._execute(launched)
        except BaseException as exc:  # handed to the scheduler's thread by wait()
            launched._error = exc
        finally:
            launched._done.set()

    def _execute(self, launched: LaunchedStep) -> None:
        step = launched.step
        if step.input_segments:
            step.batch.input_ids = resolve_inputs(step.input_segments)
        logits, launched._used_cuda_graph = self.runner.forward(step.batch)
        tp = self.runner.tp
        if step.prompt_rows is not None and (tp is None or tp.is_leader):
            launched._prompt_scores = score(logits, step.prompt_rows)
        if step.sampling is not None:
            if step.sample_rows is not None:
                logits = logits[step.sample_rows]
            sampled = self._sample(logits, step.sampling)
            launched.tokens, launched._sampled = sampled.token_ids, sampled
            launched._host_copy = _to_host_async(sampled.token_ids)
        if logits.is_cuda:
            launched._ready = torch.cuda.Event()
            launched._ready.record()


    def _sample(self, logits: torch.Tensor, sampling: SamplingBatch) -> SampledTokens:
        """Under TP every rank has the full logits, but rank 0 alone samples and the others take its tokens, so
        every rank's requests see the same tokens whatever the sampling (and the others skip it)."""
        tp = self.runner.tp
        if tp is None:
            return self.sampler.sample_batch(logits, sampling)
        if not tp.is_leader:
            return SampledTokens(tp.broadcast_tokens(None, logits.shape[0]))
        sampled = self.sampler.sample_batch(logits, sampling)
        tp.broadcast_tokens(sampled.token_ids, logits.shape[0])
        return sampled


class OverlapWorker(ModelWorker):
    """Runs steps on a worker thread, in launch order; `launch` returns at once."""

    def __init__(self, runner: ModelRunner, sampler: Sampler) -> None:
        super().__init__(runner, sampler)
        self._queue: queue.SimpleQueue[LaunchedStep | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name="toolkit-forward", daemon=True)
        self._thread.start()
        # NOTE: a forward thread still parked at interpreter exit aborts the process; stop it first.
        atexit.register(self.close)

    def launch(self, step: StepInput) -> LaunchedStep:
        launched = LaunchedStep(step)
        self._queue.put(launched)
        return launched

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)
        atexit.unregister(self.close)

    def _loop(self) -> None:
        # NOTE: the device is per thread on CUDA; the forward thread works on the model's.
        if self.runner.device.type == "cuda":
            torch.cuda.set_device(self.runner.device)
        while (launched := self._queue.get()) is not None:
            self._run(launched)


def resolve_inputs(segments: list[InputSegment]) -> torch.Tensor:
    """The batch's input ids from earlier steps' sampled tokens (all of which ran before this step)."""
    parts = [s.source.tokens if s.index is None else s.source.tokens[s.index] for s in segments]
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _to_host_async(tokens: torch.Tensor) -> torch.Tensor:
    if not tokens.is_cuda:
        return tokens
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    return host.copy_(tokens, non_blocking=True)

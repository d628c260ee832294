"""`--workers N`: one run's schedule sent by N worker processes (local, or Ray tasks with `--ray-address`).

The parent builds the workload once and warms the server up once; each worker gets its share of the arrivals
(`bench.split`) and the shared start time, sends on the global schedule with the same load loop as a single
process, and ships back its raw `RequestOutcome`s. Workers never load a tokenizer: responses whose token counts
the server did not give come back unsettled and the parent counts them, so a worker starts in well under a second.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass, replace
from time import perf_counter, time
from typing import Literal, Protocol

from toolkit.bench import eventloop
from toolkit.bench.benchmark import (Measurement, RunSettings, Target, client_for, send_workload, warm_up,
                                     warmup_bodies, while_scraping)
from toolkit.bench.client import Unsettled, settle
from toolkit.bench.options import UsageError, WorkerError
from toolkit.bench.runner import Runner, RunResult
from toolkit.bench.split import WorkerRun, merge, onto_clock, split_cap, split_workload
from toolkit.bench.workload import Workload

WorkerBackend = Literal["process", "ray"]
RAY_INSTALL = "pip install 'toolkit[ray]'"
# NOTE: the shared start is this far after the jobs are handed out; the workers are already started and idle, so
# it only has to cover shipping a share of the prompts and building its request bodies.
_START_LEAD_S: dict[WorkerBackend, float] = {"process": 1.0, "ray": 2.0}
_STARTUP_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Job:
    """What one worker sends: its share of the workload, from the shared start (unix seconds)."""

    worker: int
    workers: int
    target: Target
    settings: RunSettings
    workload: Workload
    start_at: float


@dataclass(frozen=True, slots=True)
class JobResult:
    """A worker's run on its own clock, and the responses it left for the parent to count."""

    worker: int
    run: RunResult
    unsettled: Unsettled


def run_job(job: Job) -> JobResult:
    """The worker's entry point (a process-pool task or a Ray task): the job's requests on the shared schedule.
    While it sends, SIGINT stops it as it stops a single process (the load loop's handler); before and after, the
    worker ignores SIGINT, so a late Ctrl-C cannot kill it while the parent collects its result."""
    try:
        return eventloop.run(_send_share(job))
    finally:
        _ignore_ctrl_c()


def _ignore_ctrl_c() -> None:
    with contextlib.suppress(ValueError):  # not the main thread (a Ray task may run elsewhere): nothing to ignore
        signal.signal(signal.SIGINT, signal.SIG_IGN)


async def _send_share(job: Job) -> JobResult:
    async with client_for(job.target, job.settings, job.workload) as client:
        runner = Runner(client, max_concurrency=job.settings.max_concurrency, start_at=job.start_at)
        run = await send_workload(runner, job.workload, job.target.options)
        return JobResult(job.worker, run, client.take_unsettled())


def worker_ready(_: int = 0) -> int:
    """A no-op task that brings a worker up (interpreter started, this module imported) before the run."""
    return os.getpid()


_everyone = None  # the process pool's barrier, in each of its processes (set by the pool's initializer)


def _process_ready(_: int = 0) -> int:
    """`worker_ready` in a process pool, after waiting at the barrier of all N: the N ready tasks run in N
    different processes (none can take two), so their pids are every worker's, the ones Ctrl-C is passed on to."""
    _everyone.wait(timeout=_STARTUP_TIMEOUT_S)
    return worker_ready()


class Launcher(Protocol):
    backend: WorkerBackend

    async def run(self, jobs: list[Job]) -> list[JobResult]: ...


class ProcessLauncher:
    """N spawned local processes, started and idle before the jobs go out, so each takes exactly one job."""

    backend: WorkerBackend = "process"

    def __init__(self, pool: ProcessPoolExecutor, pids: list[int]):
        self.pool = pool
        self.pids = pids

    async def run(self, jobs: list[Job]) -> list[JobResult]:
        futures = [asyncio.wrap_future(self.pool.submit(run_job, job)) for job in jobs]
        try:
            with self._ctrl_c_reaches_workers():
                return list(await asyncio.gather(*futures))
        except BrokenProcessPool:
            raise WorkerError(f"a --workers process died during the run (workers {self.pids}); its share of the "
                              "requests is lost, so no record is written") from None

    def _ctrl_c_reaches_workers(self):
        """Ctrl-C stops the run as it stops one process: each worker stops sending and returns what it has, and
        the merged record says `interrupted`. A terminal's Ctrl-C reaches the workers already (one process group);
        a SIGINT sent to this process alone is passed on."""
        return eventloop.on_ctrl_c(self._interrupt_workers)

    def _interrupt_workers(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)


class RayLauncher:
    """The same jobs as Ray tasks of one CPU each on an existing cluster."""

    backend: WorkerBackend = "ray"

    def __init__(self, ray):
        self.ray = ray
        self.task = ray.remote(num_cpus=1)(run_job)

    async def run(self, jobs: list[Job]) -> list[JobResult]:
        return list(await asyncio.gather(*(self.task.remote(job) for job in jobs)))


@contextmanager
def process_launcher(workers: int) -> Iterator[ProcessLauncher]:
    # NOTE: spawn, not fork: a forked child would inherit the parent's loaded tokenizer, threads and event loop.
    context = multiprocessing.get_context("spawn")
    # NOTE: each ready task waits at the barrier, so no ready task finishes until all N processes are up and each
    # runs one (a barrier in the initializer let one process run both ready tasks while the other was slow to take
    # one: the parent then sent Ctrl-C twice to one worker and never to the other); the N run jobs then find N idle
    # processes and each takes one.
    everyone = context.Barrier(workers)
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_join, initargs=(everyone,)) as pool:
        pids = list(pool.map(_process_ready, range(workers)))
        yield ProcessLauncher(pool, pids)


def _join(everyone) -> None:
    global _everyone
    _ignore_ctrl_c()
    _everyone = everyone


def import_ray():
    """Ray, or a one-line usage error naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise UsageError(f"--ray-address needs Ray, which is not installed: {RAY_INSTALL}") from None
    return ray


@contextmanager
def ray_launcher(address: str, workers: int) -> Iterator[RayLauncher]:
    ray = import_ray()
    connected_here = not ray.is_initialized()
    if connected_here:
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise UsageError(f"--ray-address {address}: cannot join the Ray cluster: {exc}") from None
    try:
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < workers:
            raise UsageError(f"--workers {workers}: the Ray cluster at {address} has {cpus:g} CPUs; each worker "
                             "needs one, all at once")
        ready = ray.remote(num_cpus=1)(worker_ready)
        ray.get([ready.remote() for _ in range(workers)])
        yield RayLauncher(ray)
    finally:
        if connected_here:
            ray.shutdown()


def launcher(workers: int, ray_address: str | None):
    return ray_launcher(ray_address, workers) if ray_address else process_launcher(workers)


def jobs_for(target: Target, settings: RunSettings, workload: Workload, workers: int, start_at: float) -> list[Job]:
    shares = split_workload(workload, workers)
    return [Job(w, workers, target, replace(settings, max_concurrency=split_cap(settings.max_concurrency, workers, w),
                                            warmup_requests=0), share, start_at)
            for w, share in enumerate(shares)]


async def measure_split(target: Target, settings: RunSettings, workload: Workload, tokenizer,
                        workers: int, launch: Launcher) -> Measurement:
    """Warm-up from this process, then the workload sent by `workers` workers on one schedule, merged into one run
    on this process's clock (sampling `/metrics` alongside when asked)."""
    async with client_for(target, settings, workload, tokenizer) as client:
        warmup_failures = await warm_up(client, warmup_bodies(workload, target.options, settings.warmup_requests))
    start_at = time() + _START_LEAD_S[launch.backend]
    start = perf_counter() + (start_at - time())
    jobs = jobs_for(target, settings, workload, workers, start_at)
    results, scraped, scrape_error = await while_scraping(target, settings, launch.run(jobs))
    parts = []
    for result in sorted(results, key=lambda r: r.worker):
        settle(result.unsettled, tokenizer)
        parts.append(WorkerRun(result.worker, onto_clock(result.run, result.worker, workers, start)))
    return Measurement(merge(parts), warmup_failures, scraped, scrape_error, tuple(parts), launch.backend)

"""Where the models run: in this process (``--jobs 1``), in N local processes (``--jobs N``),
or as Ray tasks (``--executor ray``) on the cluster at ``RAY_ADDRESS`` or a local one.

Every executor takes the same ``ModelJob``s and yields ``ModelResult``s as they finish (in
any order): the zoo caches and reports them the same way whatever ran them. Each model's two
sides are porter verify's own processes, with its timeout and memory limit, wherever the
model's task runs.
"""
from __future__ import annotations

import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from typing import Iterable, Iterator, Sequence

from porter.zoo.model import ModelJob, ModelResult, run_model

EXECUTORS = ("local", "ray")


class ExecutorError(RuntimeError):
    """An executor that cannot start (Ray not installed, no cluster at RAY_ADDRESS)."""


def run_local(jobs: Sequence[ModelJob], workers: int) -> Iterator[ModelResult]:
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield run_model(job)
        return
    # spawn: a worker starts from a clean interpreter (no state of this one, no threads forked)
    pool = ProcessPoolExecutor(max_workers=min(workers, len(jobs)), mp_context=get_context("spawn"))
    try:
        pending = {pool.submit(run_model, job) for job in jobs}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in done:
                yield fut.result()
    finally:  # interrupted: queued models never start; running ones stop their sides (verify's watch)
        pool.shutdown(wait=True, cancel_futures=True)


def _ray():
    try:
        import ray
    except ModuleNotFoundError:
        raise ExecutorError("--executor ray needs Ray: pip install 'porter[ray]'") from None
    return ray


def run_ray(jobs: Sequence[ModelJob], workers: int) -> Iterator[ModelResult]:
    """One Ray task per model. With ``RAY_ADDRESS`` set, the tasks go to that cluster (whose
    nodes must have porter, the zoo's frameworks and the zoo's folder DIR at the same paths);
    without it, a local cluster of ``workers`` CPUs is started for the run and stopped after."""
    ray = _ray()
    started = False
    if not ray.is_initialized():
        address = os.environ.get("RAY_ADDRESS")
        try:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:
                ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ExecutorError(f"could not start or reach a Ray cluster{f' at {address}' if address else ''}: {exc}") from None
        started = True
    task = ray.remote(num_cpus=1, max_retries=0)(run_model)
    try:
        pending = [task.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                yield ray.get(ref)
    except BaseException:
        for ref in pending if "pending" in locals() else ():
            ray.cancel(ref, force=True)
        raise
    finally:
        if started:
            ray.shutdown()


def run_jobs(jobs: Iterable[ModelJob], workers: int, executor: str = "local") -> Iterator[ModelResult]:
    jobs = list(jobs)
    if executor == "ray":
        return run_ray(jobs, workers)
    if executor == "local":
        return run_local(jobs, workers)
    raise ExecutorError(f"unknown executor {executor!r} ({', '.join(EXECUTORS)})")

"""A Prefect flow on a Dask cluster of worker processes, every task gated: ``python dask_flow.py ARGS``.

Args: ledger URL, lane, task count, estimate, seconds each body runs, Dask workers, threads per
worker, the JSON-lines file, the task whose first run kills its own worker right after its
settlement commits, and the task whose body raises on its first Prefect run (Prefect's retry runs
it again; -1: none). PREFECT_API_URL names the server; LANE_FAULT_MARKER the file that
fault point writes before it kills. Each body writes ``start`` (its process id, task run id and
run count) when it begins, i.e. while it holds its lease, and ``end`` with the tokens it reported
(random, so each run's settlement can be told apart); the flow writes one ``final`` line per task
(task run id, state, result). The parent kills a worker process by the pids of the ``start`` lines.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time


def _out(path: str, **record) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def main(
    url: str,
    lane: str,
    n: str,
    est: str,
    seconds: str,
    workers: str,
    threads: str,
    out: str,
    fault_task: str = "-1",
    flaky_task: str = "-1",
) -> None:
    os.environ["LANE_DATABASE_URL"] = url  # the Dask worker processes inherit it (spawned after this)
    from prefect import flow
    from prefect.runtime import task_run
    from prefect_dask import DaskTaskRunner

    from lane_plugin import lane_task, report_usage

    est_n, pause, fault_i, flaky_i = int(est), float(seconds), int(fault_task), int(flaky_task)
    marker = os.environ.get("LANE_FAULT_MARKER", "")

    @lane_task(stage="dask", estimate=est_n, lane=lane, retries=2, retry_delay_seconds=0)
    def work(i: int) -> str:
        _out(
            out,
            event="start",
            i=i,
            pid=os.getpid(),
            task_run=str(task_run.id),
            run_count=task_run.run_count,
            t=time.time(),
        )
        time.sleep(pause)
        spent = random.randint(est_n // 2, est_n)
        report_usage(spent)
        if i == fault_i and marker and not os.path.exists(marker):
            # this worker dies right after this run's settlement commits, before Dask has the result
            os.environ["LANE_FAULT"] = "settle.after_commit"
        _out(
            out,
            event="end",
            i=i,
            pid=os.getpid(),
            task_run=str(task_run.id),
            run_count=task_run.run_count,
            spent=spent,
            t=time.time(),
        )
        if i == flaky_i and task_run.run_count == 1:
            raise RuntimeError("flaky: the provider failed after spending tokens; Prefect retries")
        return f"spent={spent}"  # a string: the gate reads no usage from it

    runner = DaskTaskRunner(
        cluster_kwargs={
            "n_workers": int(workers),
            "threads_per_worker": int(threads),
            "processes": True,
            "dashboard_address": None,
        }
    )

    @flow(task_runner=runner)
    def dask_gated(count: int):
        futures = [work.submit(i) for i in range(count)]
        return [(f.task_run_id, f.wait() or f.state) for f in futures]

    for task_run_id, state in dask_gated(int(n)):
        result = state.result(raise_on_failure=False)
        _out(
            out,
            event="final",
            task_run=str(task_run_id),
            state=state.type.value,
            result=result if isinstance(result, str) else repr(result),
        )


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Issue 10 item 11, past one machine: gated tasks on a Dask cluster of worker processes.

A real ``prefect server start`` (its own PREFECT_HOME, a free port), one PostgreSQL ledger, a flow
with ``DaskTaskRunner`` (3 worker processes, 2 threads each) running ``@lane_task`` tasks with
retries. Two workers die by SIGKILL while their tasks hold leases:

* one killed from outside while its bodies run (leases held, checked with SQL just before);
* one killed by the ``settle.after_commit`` fault point, right after a settlement committed and
  before Dask had the result (the window where a rerun found its job settled and waited for ever).

Dask runs the dead workers' tasks again on the other workers (and the nanny restarts the dead
one). Then, with SQL of our own on the tables: no lease is left, every task run is Completed (the
flow's states and the server's API), every run that finished its body on a live worker is billed
exactly once and none twice, ``spent`` is the sum of the settlements and ``reserved``/``leased``
the sums over leased jobs (nothing leaked). Needs PostgreSQL (skips with the reason otherwise).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.testing.prefect_server import real_server

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, reps

pytest.importorskip("prefect_dask", reason="needs the dask extra: pip install 'lane-plugin[dask]'")

FLOW = Path(__file__).with_name("dask_flow.py")
TASKS, EST, SECONDS, WORKERS, THREADS, LEASE = 12, 100, 2.5, 3, 2, 4.0
WAIT_FLOW = 200  # seconds the flow may take (about 40 under no load)
FAULT, FLAKY = 0, TASKS - 1  # the task whose worker dies after its settlement; the task that raises once


class Sql:
    """Our own reads of the ledger's tables (psycopg, not the library)."""

    def __init__(self, url: str):
        import psycopg

        from lane_plugin.ledger.url import parse_url

        self.conn = psycopg.connect(**dict(parse_url(url).conninfo), autocommit=True)

    def all(self, query: str, *params) -> list[tuple]:
        return self.conn.execute(query, params).fetchall()

    def close(self) -> None:
        self.conn.close()


def _dead(pid: int, timeout: float = 15.0) -> str:
    """Wait until ``pid`` is gone (or a zombie); returns how it was seen dead."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return "pid gone"
        if state == "Z":
            return "zombie (exited)"
        time.sleep(0.05)
    raise AssertionError(f"worker process {pid} still alive {timeout}s after SIGKILL")


def _api(api: str, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(
        f"{api}{path}", data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _task_run_states(api: str, ids: set[str], timeout: float = 30.0) -> dict[str, str]:
    """The server's state of each task run (task run states reach it as events: wait for them)."""
    end = time.monotonic() + timeout
    while True:
        runs = _api(api, "/task_runs/filter", {"task_runs": {"id": {"any_": sorted(ids)}}, "limit": 200})
        states = {r["id"]: (r.get("state_type") or "") for r in runs}
        if all(states.get(i) == "COMPLETED" for i in ids) or time.monotonic() > end:
            return states
        time.sleep(0.5)


def _one_round(pg_url: str, tmp_path: Path, api: str, env: dict, lane: str) -> dict:
    led = Ledger(pg_url)
    make_lane(led, lane, ceiling=100_000, lease_seconds=LEASE, max_leased=64)
    sql = Sql(pg_url)
    out, log, marker = tmp_path / f"{lane}.jsonl", tmp_path / f"{lane}-flow.log", tmp_path / f"{lane}.fault"
    flow_env = {**env, "LANE_DATABASE_URL": pg_url, "LANE_FAULT_MARKER": str(marker), "PREFECT_LOGGING_LEVEL": "INFO"}
    with log.open("w") as fh:
        flow = subprocess.Popen(
            [
                sys.executable,
                str(FLOW),
                pg_url,
                lane,
                str(TASKS),
                str(EST),
                str(SECONDS),
                str(WORKERS),
                str(THREADS),
                str(out),
                str(FAULT),
                str(FLAKY),
            ],
            env=flow_env,
            cwd=tmp_path,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    killed = held = None
    try:
        end = time.monotonic() + WAIT_FLOW
        while flow.poll() is None and time.monotonic() < end:
            recs = read_json_lines(out)
            running = Counter((r["pid"], r["task_run"]) for r in recs if r["event"] == "start")
            running.subtract((r["pid"], r["task_run"]) for r in recs if r["event"] == "end")
            fault_pid = next((r["pid"] for r in recs if r["event"] == "start" and r["i"] == FAULT), None)
            by_pid = defaultdict(list)
            for (pid, task_run), n in running.items():
                if n > 0 and pid != fault_pid:
                    by_pid[pid].append(task_run)
            if killed is None and fault_pid is not None and by_pid:
                pid, runs = max(by_pid.items(), key=lambda kv: len(kv[1]))
                keys = [f"prefect-task-run:{r}" for r in runs]
                held = sql.all(
                    "select key from job where key = any(%s) and state = 'leased' "
                    "and lease_until > extract(epoch from clock_timestamp())",
                    keys,
                )
                os.kill(pid, signal.SIGKILL)
                killed = (pid, runs, _dead(pid))
                ended = {r["task_run"] for r in read_json_lines(out) if r["event"] == "end" and r["pid"] == pid}
                runs = [r for r in runs if r not in ended]  # a body that returned in the last milliseconds
                missing = {f"prefect-task-run:{r}" for r in runs} - {k for (k,) in held}
                assert runs and not missing, f"bodies running at the kill without a live lease: {missing}"
                killed = (pid, runs, killed[2])
            time.sleep(0.05)
        code = flow.poll()
    finally:
        if flow.poll() is None:
            os.killpg(flow.pid, signal.SIGKILL)
            flow.wait()
    text = log.read_text()
    if code is None:
        recs = read_json_lines(out)
        done = {r["task_run"] for r in recs if r["event"] in ("end", "final")}
        stuck = sorted({r["task_run"] for r in recs if r["event"] == "start"} - done)
        waiting = [line for line in text.splitlines() if "job waiting" in line][-3:]
        pytest.fail(
            f"the flow did not finish in {WAIT_FLOW} s (killed); task runs started and never ended: {stuck}; "
            "the last waits:\n" + "\n".join(waiting) + f"\nits log ends:\n{text[-2000:]}"
        )
    assert code == 0, f"flow exited {code}:\n{text[-4000:]}"
    assert killed is not None, "no worker was ever seen running a gated body: nothing was killed"
    pid, killed_runs, seen = killed
    assert f"Worker process {pid} was killed by signal 9" in text, text[-3000:]
    assert marker.exists() and marker.read_text() == "settle.after_commit", "the fault point never fired"
    recs = read_json_lines(out)
    fault_pid = next(r["pid"] for r in recs if r["event"] == "start" and r["i"] == FAULT)
    assert f"Worker process {fault_pid} was killed by signal 9" in text, text[-3000:]
    dead = {pid, fault_pid}

    # every task Completed: in the flow's states, and on the server
    finals = {r["task_run"]: r for r in recs if r["event"] == "final"}
    assert len(finals) == TASKS and all(f["state"] == "COMPLETED" for f in finals.values()), finals
    states = _task_run_states(api, set(finals))
    assert all(states.get(i) == "COMPLETED" for i in finals), states
    flow_runs = _api(api, "/flow_runs/filter", {"limit": 50})
    assert flow_runs and all(r["state_type"] == "COMPLETED" for r in flow_runs), [
        (r["name"], r["state_type"]) for r in flow_runs
    ]

    # our SQL: no lease left; the lane's counters are its tables
    lane_row = sql.all("select spent, reserved, leased, overage from lane where name = %s", lane)[0]
    jobs = sql.all("select key, state, attempt, est, actual, id from job where lane = %s", lane)
    leased = [j for j in jobs if j[1] == "leased"]
    assert leased == [], f"leases left after the run: {leased}"
    assert lane_row[1] == sum(j[3] for j in leased) and lane_row[2] == len(leased), lane_row
    assert len(jobs) == TASKS and all(j[1] == "done" for j in jobs), jobs
    setts = sql.all(
        "select j.key, s.attempt, s.actual, s.late from settlement s join job j on j.id = s.job_id where j.lane = %s",
        lane,
    )
    assert len({(k, a) for k, a, _, _ in setts}) == len(setts), "an attempt settled twice"
    assert lane_row[0] == sum(a for _, _, a, _ in setts), f"spent {lane_row[0]} != sum of settlements"
    for key, *_, actual, _ in jobs:
        assert actual == sum(a for k, _, a, _ in setts if k == key), key

    # each body run billed once: a run that ended on a live worker has its settlement; none twice
    ends = defaultdict(list)
    for r in recs:
        if r["event"] == "end":
            ends[f"prefect-task-run:{r['task_run']}"].append((r["pid"], r["spent"]))
    reruns_after_settle = 0
    flaky_run = next(r["task_run"] for r in recs if r["event"] == "start" and r["i"] == FLAKY)
    for key, *_ in jobs:
        billed = sorted(a for k, _, a, _ in setts if k == key)
        live = sorted(s for p, s in ends[key] if p not in dead)
        every = sorted(s for _, s in ends[key])
        assert len(billed) <= len(every) and not (Counter(billed) - Counter(every)), (key, billed, ends[key])
        assert not (Counter(live) - Counter(billed)), f"{key}: a finished run was not billed: {ends[key]} {billed}"
        final = int(finals[key.split(":", 1)[1]]["result"].split("=")[1])
        assert final in billed, (key, final, billed)
        reruns_after_settle += len(billed) > 1 and key != f"prefect-task-run:{flaky_run}"
    # Prefect's retry: the flaky task's first run raised after spending; billed as failed, then retried
    outcomes = sql.all(
        "select s.outcome from settlement s join job j on j.id = s.job_id where j.key = %s order by s.attempt",
        f"prefect-task-run:{flaky_run}",
    )
    assert [o for (o,) in outcomes][-2:] == ["failed", "done"], outcomes
    assert any(r["event"] == "start" and r["i"] == FLAKY and r["run_count"] == 2 for r in recs)
    for run in killed_runs:  # the leases held at kill time ended: voided by the rerun's new attempt
        job = next(j for j in jobs if j[0] == f"prefect-task-run:{run}")
        assert job[1] == "done" and job[2] >= 2, job
    assert reruns_after_settle >= 1, "no task ran again after its settlement: the fault point missed its window"
    assert_audit_clean(led)
    sql.close()
    led.close()
    return {
        "held": len(held),
        "seen": seen,
        "settlements": len(setts),
        "spent": lane_row[0],
        "retried": len(outcomes),
        "reruns_after_settle": reruns_after_settle,
        "leases_left": len(leased),
    }


@pytest.mark.pg_processes  # a Dask cluster of ledger processes on PostgreSQL: one such test at a time
@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dask_worker_killed_while_holding_leases(pg_url, tmp_path):
    rounds = reps(1, 3)
    results = []
    t0 = time.monotonic()
    with real_server(tmp_path) as (api, env):
        for n in range(rounds):
            results.append(_one_round(pg_url, tmp_path, api, env, f"dask{n}"))
    took = time.monotonic() - t0
    figure(
        f"dask pg: {rounds} round(s), real prefect server, {TASKS} @lane_task tasks (retries=2) on {WORKERS} Dask "
        f"worker processes x {THREADS} threads, lease {LEASE:g} s: per round one worker SIGKILLed holding "
        f"{'/'.join(str(r['held']) for r in results)} live lease(s) (then {results[0]['seen']}), one killed right "
        f"after a settlement commit, one task failing once; {rounds * TASKS} of {rounds * TASKS} task runs "
        f"Completed, 0 leases left; {sum(r['settlements'] for r in results)} settlements, one per (job, attempt), "
        f"each a body run that finished ({sum(r['reruns_after_settle'] for r in results)} task(s) Dask ran again "
        f"after their settlement, billed as the next attempt); sum(actual) == spent, reserved == leased == 0 == "
        f"the leased jobs; audit clean; {took:.0f} s"
    )

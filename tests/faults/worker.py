"""Worker processes for the fault suite: ``python worker.py MODE ARGS...``.

Each mode drives the public Ledger API as a separate OS process would on
another machine, and writes what it was told (acknowledged results, errors
that reached it) as JSON lines, so the parent can compare them with the tables.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path


def _out(path: str, **record) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _err(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__name__}: {exc}"


def _wait_for(path: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise SystemExit(f"gave up waiting for {path}")
        time.sleep(0.005)


def contention(url: str, lane: str, n: str, out: str, go: str) -> None:
    """Submit n unit jobs, wait for the start signal, then tick and settle until the lane is spent."""
    from lane_plugin import Ledger

    led = Ledger(url)
    errors: list[str] = []
    admitted = 0
    try:
        for i in range(int(n)):
            led.submit("unit", 1, lane, key=f"{os.getpid()}-{i}-{uuid.uuid4().hex[:6]}")
        Path(out + ".ready").touch()
        _wait_for(go)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            leases = led.tick(lane)
            admitted += len(leases)
            for lease in leases:
                led.settle(lease, 1)
            if not leases:
                row = led.lane(lane)
                if row.spent >= row.ceiling:
                    break
                time.sleep(random.random() * 0.002)
    except Exception as exc:  # any error reaching the caller is a failure of the test
        errors.append(_err(exc) + "\n" + traceback.format_exc())
    _out(out, admitted=admitted, errors=errors)


def settle_dup(url: str, job_id: str, attempt: str, actual: str, calls: str, out: str, go: str) -> None:
    """Send the same settlement ``calls`` times from threads, all at once."""
    from lane_plugin import Ledger

    led = Ledger(url)
    led.job(job_id)  # connect and check the schema before the start signal
    results: list[dict] = []
    lock = threading.Lock()

    def one():
        try:
            r = led.settle(job_id, int(actual), attempt=int(attempt))
            rec = {"replay": r.replay, "actual": r.actual}
        except Exception as exc:
            rec = {"error": _err(exc)}
        with lock:
            results.append(rec)

    threads = [threading.Thread(target=one) for _ in range(int(calls))]
    Path(out + ".ready").touch()
    _wait_for(go)
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rec in results:
        _out(out, **rec)


def settle_once(url: str, job_id: str, attempt: str, actual: str, out: str) -> None:
    """Settle one attempt (LANE_FAULT may kill this process inside or after the commit)."""
    from lane_plugin import Ledger

    r = Ledger(url).settle(job_id, int(actual), attempt=int(attempt))
    _out(out, replay=r.replay, actual=r.actual, late=r.late)


def hold(url: str, job_id: str, actual: str, out: str, work: str = "0.5") -> None:
    """Acquire a job, report the lease, 'work' a while, then settle with the lease it holds."""
    from lane_plugin import Ledger
    from lane_plugin.ledger import wait_and_acquire

    led = Ledger(url)
    lease = wait_and_acquire(led, job_id, timeout=60, poll=0.02)
    _out(out, event="leased", attempt=lease.attempt, lease_until=lease.lease_until)
    time.sleep(float(work))  # a zombie is SIGSTOPped here, past its lease
    r = led.settle(lease, int(actual))
    _out(out, event="settled", attempt=r.attempt, late=r.late, replay=r.replay, actual=r.actual)


def gated(url: str, lane: str, seconds: str, out: str) -> None:
    """A gated worker: submit, acquire, settle in a loop; log every acknowledged settlement."""
    from lane_plugin import Ledger
    from lane_plugin.ledger import wait_and_acquire

    led = Ledger(url, retry_for=120.0)
    end = time.monotonic() + float(seconds)
    n = 0
    while time.monotonic() < end:
        try:
            key = f"g-{os.getpid()}-{n}"
            job_id = led.submit("gated", random.randint(1, 20), lane, key=key)
            lease = wait_and_acquire(led, job_id, timeout=120, poll=0.01)
            if lease is None:
                _out(out, error=f"job {job_id} never admitted")
                continue
            actual = random.randint(0, 25)
            r = led.settle(lease, actual)
            _out(out, job_id=job_id, attempt=r.attempt, actual=r.actual, replay=r.replay)
        except Exception as exc:
            _out(out, error=_err(exc))
        n += 1


def skew(url: str, job_id: str, offset: str, out: str) -> None:
    """A worker whose clock is off by ``offset`` seconds: acquire, reap, report what the ledger did."""
    real = time.time
    time.time = lambda: real() + float(offset)  # the worker's wall clock is wrong
    from lane_plugin import Ledger

    led = Ledger(url)
    lease = led.acquire(job_id)
    moved = led.reap()
    _out(
        out,
        attempt=lease.attempt if lease else None,
        lease_until=lease.lease_until if lease else None,
        ledger_now=led.now(),
        worker_now=time.time(),
        reaped=list(moved.requeued),
    )


def lease_at(url: str, job_id: str, at: str, out: str) -> None:
    """A holder whose ledger clock reads ``at`` (e.g. a day fast): lease the job, say so, then hang, never
    renewing, until killed."""
    from lane_plugin import Ledger

    lease = Ledger(url, clock=lambda: float(at)).acquire(job_id)
    _out(
        out, attempt=lease.attempt if lease else None, lease_until=lease.lease_until if lease else None, pid=os.getpid()
    )
    time.sleep(600)


def reap_only(url: str, offset: str, out: str) -> None:
    real = time.time
    time.time = lambda: real() + float(offset)
    from lane_plugin import Ledger

    led = Ledger(url)
    moved = led.reap()
    _out(out, reaped=list(moved.requeued), ledger_now=led.now())  # now: the reap ran at or before it


def prefect_flow(url: str, lane: str, n: str, est: str, out: str) -> None:
    """One 'machine': a Prefect flow of n gated tasks against the shared ledger (PREFECT_API_URL set)."""
    os.environ["LANE_DATABASE_URL"] = url
    from prefect import flow
    from prefect.task_runners import ThreadPoolTaskRunner

    from lane_plugin import LaneError, lane_task, report_usage

    @lane_task(stage="machine", estimate=int(est), lane=lane, deadline=12.0, ledger=url)
    def work(i: int) -> str:
        time.sleep(random.uniform(0.05, 0.3))
        spent = random.randint(int(est) // 2, int(est))
        report_usage(spent)
        return f"spent={spent}"  # a string: the gate reads no usage from it (an int would bill again)

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=8))
    def machine(count: int):
        futures = [work.submit(i) for i in range(count)]
        return [f.wait() or f.state for f in futures]

    states = machine(int(n))
    for state in states:
        if state.is_completed():
            _out(out, outcome="done", actual=int(state.result().split("=")[1]))
            continue
        try:
            state.result()
            _out(out, outcome="weird", detail=str(state))
        except LaneError as exc:
            _out(out, outcome=type(exc).__name__, detail=str(exc))
        except Exception as exc:
            _out(out, outcome="unclear", detail=_err(exc))


def tenant_ops(url: str, lane: str, seed: str, seconds: str, out: str, go: str) -> None:
    """Random operations on a lane shared by three tenants, one with a budget: submit, tick, settle (at most
    the estimate, so the budget's spent + reserved is exact), reap. Counts what it did; the parent may
    SIGKILL it at any point (holding leases, inside a transaction)."""
    from lane_plugin import Ledger

    rng = random.Random(int(seed))
    led = Ledger(url, retry_for=60.0)
    led.lane(lane)  # connect and check the schema before the start signal
    Path(out + ".ready").touch()
    _wait_for(go)
    held: list = []
    done = {"submit": 0, "tick": 0, "settle": 0, "reap": 0}
    errors: list[str] = []
    end = time.monotonic() + float(seconds)
    while time.monotonic() < end:
        try:
            op = rng.random()
            if op < 0.4:
                led.submit("t", rng.randint(50, 300), lane, tenant=rng.choice(["capped", "capped", "other", "third"]))
                done["submit"] += 1
            elif op < 0.7:
                held += led.tick(lane)
                done["tick"] += 1
            elif op < 0.97 and held:
                lease = held.pop(rng.randrange(len(held)))
                led.settle(lease, rng.randint(lease.est // 2, lease.est))
                done["settle"] += 1
            else:
                led.reap()
                done["reap"] += 1
        except Exception as exc:  # lost leases after a reap are expected; anything else is reported
            errors.append(_err(exc))
        _out(out, **done) if sum(done.values()) % 50 == 0 else None
    _out(out, **done, errors=errors[:20])


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])

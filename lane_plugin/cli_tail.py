"""``lane tail``: parked jobs, and putting one back (``requeue``) or failing it for good (``drop``).

A gated job (one a Prefect task run waited for) is not requeued: nobody would wait for it, and it would
be parked again a few seconds later as ``waiter gone``. Its task submits it again when its flow run is
re-run, so ``lane tail requeue`` says that instead (exit 5).
"""

from __future__ import annotations

from typing import Optional

import typer

from .cli_common import JSON, PLAIN, WIDE, ledger, print_json, print_table
from .cli_text import duration

tail_app = typer.Typer(help="Parked jobs: list them, requeue one, or drop one.", invoke_without_command=True, **PLAIN)
TAIL_COLUMNS = ["job", "lane", "stage", "est", "parked for", "expires in", "reason"]
TASK_RUN_KEY = "prefect-task-run:"  # the idempotency key of a gated job: the Prefect task run's id


@tail_app.callback()
def tail(
    ctx: typer.Context,
    lane: Optional[str] = typer.Option(None, help="Only this lane."),
    as_json: bool = JSON,
    wide: bool = WIDE,
):
    """List parked jobs with age, deadline and reason (the reason on its own line; --wide: one line per job)."""
    if ctx.invoked_subcommand:
        return
    led = ledger(create=False)
    if lane is not None:
        led.lane(lane)  # unknown lane: exit 3
    jobs = led.tail(lane)
    if as_json:
        print_json(jobs)
        return
    now = led.now()
    rows = [
        [
            j["job_id"],
            j["lane"],
            j["stage"],
            f"{j['est']:,}",
            duration(j["age"]),
            duration(j["deadline"] - now),
            j["reason"],
        ]
        for j in jobs
    ]
    print_table(
        f"tail: {len(jobs)} parked",
        TAIL_COLUMNS,
        rows,
        wide=wide,
        right={"est"},
        below="reason",
        optional=["expires in", "parked for"],
    )


def gated_advice(job: dict) -> str | None:
    """What to do instead of requeueing ``job`` (a row of ``Ledger.job``), if it is a gated job; else None."""
    key = job.get("key") or ""
    if job.get("waiter") is None and not key.startswith(TASK_RUN_KEY):
        return None
    task_run = key[len(TASK_RUN_KEY) :].split(":", 1)[0] if key.startswith(TASK_RUN_KEY) else None
    flow_run = job.get("run_key")
    whose = f" of Prefect task run {task_run}" if task_run else ""
    rerun = (
        f"prefect flow-run retry {flow_run} (add --entrypoint FILE.py:FLOW if it has no deployment)"
        if flow_run
        else "run its flow again"
    )
    return (
        f"job {job['id']} is a gated job{whose}: its task submits it again when its flow run is re-run, "
        f"and requeued it would be parked again as 'waiter gone'; re-run the flow run instead: {rerun}; "
        f"lane tail drop {job['id']} clears this one"
    )


@tail_app.command("requeue")
def tail_requeue(job_id: str = typer.Argument(..., help="A parked job (not a gated one: re-run its flow run).")):
    """Put a parked job back in the queue. A gated job (a Prefect task run's) is refused, exit 5: its task
    submits it again when its flow run is re-run (prefect flow-run retry FLOW_RUN)."""
    from .errors import GatedJob

    led = ledger()
    job = led.job(job_id)
    advice = gated_advice(job) if job["state"] == "parked" else None
    if advice is not None:
        raise GatedJob(advice, job_id=job_id, run_key=job.get("run_key"))
    led.requeue(job_id)
    typer.echo(f"requeued {job_id}")


@tail_app.command("drop")
def tail_drop(job_id: str = typer.Argument(..., help="A parked job.")):
    """Fail a parked job for good."""
    ledger().drop(job_id)
    typer.echo(f"dropped {job_id}")


__all__ = ["gated_advice", "tail_app"]

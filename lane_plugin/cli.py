"""The ``lane`` command line.

``submit``, ``tick`` and ``settle`` import neither Prefect nor pandas, so a
shell loop of them stays fast. Errors print one line and exit non-zero:
1 audit found violations, 2 bad input, 3 unknown lane, tenant, job or ledger,
4 never fits, 5 wrong state (not leased, not parked), 6 conflicting replay, 7 parked,
8 database. ``--db`` may come before or after the command. Read-only commands
(``lanes``, ``status``, ``report``, ``tail``, ``audit``) never create a ledger.
"""

from __future__ import annotations

import sys
from typing import Optional

import typer

from .cli_common import JSON, PLAIN, WIDE, ledger, print_json, state
from .cli_lanes import lanes_app, status
from .cli_tail import tail_app
from .cli_tenants import tenants_app
from .cli_text import hoist_db, with_value
from .errors import LaneError

app = typer.Typer(
    help="Token-weighted admission for LLM pipelines: a ledger of lanes, jobs, leases and settlements. "
    "Every command that reads a ledger names it first, on stderr. "
    "Exit codes: 1 audit violations, 2 bad input, 3 unknown lane, tenant, job or ledger, 4 never fits, "
    "5 wrong state, 6 conflicting replay, 7 parked, 8 database.",
    no_args_is_help=True,
    **PLAIN,
)
db_app = typer.Typer(help="The ledger's database schema.", no_args_is_help=True, **PLAIN)
auto_app = typer.Typer(help="Prefect Automations that page on lane events.", no_args_is_help=True, **PLAIN)
app.add_typer(lanes_app, name="lanes")
app.add_typer(tail_app, name="tail")
app.add_typer(tenants_app, name="tenants")
app.add_typer(db_app, name="db")
app.add_typer(auto_app, name="automations")
app.command("status")(status)


@app.callback()
def main_options(
    db: Optional[str] = typer.Option(
        None,
        "--db",
        metavar="URL",
        help="Ledger URL, or block:lane-ledger/NAME (default: $LANE_DATABASE_URL, else lane.db under "
        "PREFECT_HOME). May come before or after the command.",
        show_default=False,
    ),
):
    state["db"] = db


@app.command()
def submit(
    stage: str = typer.Option(..., help="Pipeline stage (stored verbatim)."),
    est: int = typer.Option(..., help="Estimated tokens (the budget is charged this until it settles)."),
    lane: str = typer.Option("free", help="Lane to wait in."),
    rate_cost: Optional[int] = typer.Option(
        None, help="What the provider's rate limiter counts (e.g. prompt + max_tokens); default --est."
    ),
    est_version: Optional[str] = typer.Option(None, help="Estimator name/version that made --est."),
    run_key: Optional[str] = typer.Option(None, help="Pipeline run this job belongs to."),
    key: Optional[str] = typer.Option(None, help="Idempotency key: the same key returns the same job."),
    wait: Optional[float] = typer.Option(None, help="Seconds it may wait before it is parked."),
    fallback: Optional[str] = typer.Option(None, help="Lane to fall back to ('lane' = the lane's own fallback)."),
    est_input: Optional[int] = typer.Option(
        None, help="Input tokens counted for this job (learned estimators learn actual minus this)."
    ),
    tenant: Optional[str] = typer.Option(
        None, help="Who the job belongs to inside the lane (shared fairly by tokens); default 'default'."
    ),
    as_json: bool = JSON,
):
    """Record a job; prints only its id on stdout, so id=$(lane submit ...) works (its attempt goes to stderr)."""
    fb = True if fallback == "lane" else fallback
    led = ledger()
    jid = led.submit(
        stage,
        est,
        lane,
        rate_cost=rate_cost,
        est_version=est_version,
        run_key=run_key,
        key=key,
        wait_seconds=wait,
        fallback=fb,
        est_input=est_input,
        tenant=tenant,
    )
    job = led.job(jid)  # a known --key may name a job already retried: say which attempt it is at
    if as_json:
        print_json(
            {
                "id": jid,
                "attempt": job["attempt"],
                "ref": f"{jid}:{job['attempt']}",
                "lane": job["lane"],
                "state": job["state"],
            }
        )
        return
    typer.echo(jid)
    typer.echo(
        f"job {jid} attempt {job['attempt']} ({job['state']} in lane {job['lane']}; "
        f"settle it as {jid}:{job['attempt']})",
        err=True,
    )


@app.command()
def tick(lane: str = typer.Option("free", help="Lane to admit in."), as_json: bool = JSON):
    """Lease what fits now, in priority order (small first, age raising priority), within budget, burst and lease caps."""
    led = ledger()
    leases = led.tick(lane)
    ok, why = led.preflight.last(lane)
    if not ok:  # nothing admitted, and the reason is said, never a silent exit
        typer.echo(f"lane {lane}: preflight failed: {why}", err=True)
    if as_json:
        print_json(
            [
                {
                    "id": x.job_id,
                    "stage": x.stage,
                    "est": x.est,
                    "rate_cost": x.rate_cost,
                    "lane": x.lane,
                    "attempt": x.attempt,
                    "ref": f"{x.job_id}:{x.attempt}",
                    "lease_until": x.lease_until,
                    "token": x.token,
                }
                for x in leases
            ]
        )
        return
    for x in leases:
        typer.echo(f"{x.job_id}:{x.attempt}\t{x.stage}\t{x.est}\tattempt {x.attempt}")
    typer.echo(f"leased {len(leases)} jobs, {sum(x.est for x in leases)} tokens", err=True)


@app.command()
def settle(
    job_id: str = typer.Argument(..., help="Job to settle: ID:ATTEMPT as lane tick prints it, or a bare ID."),
    actual: int = typer.Option(..., help="Tokens really spent."),
    attempt: Optional[int] = typer.Option(
        None,
        help="Attempt (or ID:ATTEMPT). A bare ID means the job's only leased attempt; a job leased as "
        "several attempts refuses it (exit 2), so no attempt's tokens are billed to another.",
    ),
    failed: bool = typer.Option(False, "--failed", help="The attempt failed (its tokens are still billed)."),
    as_json: bool = JSON,
):
    """Bill what an attempt really spent, exactly once (a replay bills nothing; another actual is exit 6)."""
    from dataclasses import asdict

    r = ledger().settle(job_id, actual, attempt=attempt, outcome="failed" if failed else "done")
    if as_json:
        print_json(asdict(r))
        return
    notes = [n for n, on in (("replay: billed nothing", r.replay), ("late", r.late)) if on]
    over = f", overage {r.overage}" if r.overage else ""
    typer.echo(
        f"settled {r.job_id} attempt {r.attempt}: {r.actual} tokens{over}" + (f" ({', '.join(notes)})" if notes else "")
    )


@app.command()
def reap(
    overdue: bool = typer.Option(False, "--overdue", help="Also park jobs past their deadline and expire the tail."),
    as_json: bool = JSON,
):
    """Return expired leases to the queue (attempt + 1), or park them when attempts are exhausted."""
    led = ledger()
    moved = led.park_overdue() if overdue else led.reap()
    if as_json:
        print_json({"requeued": moved.requeued, "parked": moved.parked, "expired": moved.expired})
        return
    typer.echo(f"requeued {len(moved.requeued)}, parked {len(moved.parked)}, expired {len(moved.expired)}")


def _report_help() -> str:
    """``lane report --help``: what the command does, then every column of its table, one per line."""
    import textwrap

    from .reports.drift import COLUMNS_EXPLAINED

    pad = max(len(c) for c in COLUMNS_EXPLAINED) + 4
    lines = []
    for column, why in COLUMNS_EXPLAINED.items():
        lines += textwrap.wrap(why, width=96, initial_indent=f"  {column}".ljust(pad), subsequent_indent=" " * pad)
    return (
        "Drift per stage: sum(actual) / sum(est) of done jobs, as in the article.\n\n"
        "With --by stage,version each shadow estimator sits beside the admission one on the same jobs. "
        "The table fits 100 characters, leaving out the last columns (it names them); --wide shows them all, "
        "as do --format csv, json and markdown.\n\n\b\nColumns:\n" + "\n".join(lines)
    )


@app.command(help=_report_help())
def report(
    lane: Optional[str] = typer.Option(None, help="Only this lane."),
    since: Optional[str] = typer.Option(None, help="Only jobs finished within this span (24h, 7d...)."),
    by: str = typer.Option(
        "stage",
        help="Group by: stage, lane, est_version, or version (admission and shadow estimates), comma separated.",
    ),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or markdown."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw drift per stage over time to this PNG."),
    wide: bool = WIDE,
):
    led = ledger(create=False)
    if lane is not None:
        led.lane(lane)  # an unknown lane is exit 3, not an empty report
    from .reports import drift, drift_over_time, plot_drift, render, spend_over_time

    df = drift(led, lane=lane, since=since, by=by)
    if plot:
        spend = spend_over_time(led, lane=lane, since=since)
        plot_drift(drift_over_time(led, lane=lane, since=since), plot, spend=spend)
        typer.echo(f"plot written to {plot}", err=True)
    if df.empty and fmt == "table":
        where = (f" in lane {lane}" if lane else "") + (f" in the last {since}" if since else "")
        typer.echo(f"no settled jobs in the ledger at {led.url}{where}")
        return
    typer.echo(render(df, fmt, wide=wide))


@db_app.command("upgrade")
def db_upgrade():
    """Create the ledger's tables, or upgrade them to this version's schema."""
    led = ledger()
    typer.echo(f"{led.url}: schema at revision {led.upgrade()}")


@app.command()
def audit(grace: float = typer.Option(60.0, help="Reap interval: how long a lease may outlive its expiry.")):
    """Check invariants I1-I7 from the tables; exits 1 naming each violation."""
    bad = ledger(create=False).audit(grace=grace)
    for line in bad:
        typer.echo(line)
    if bad:
        raise typer.Exit(1)
    typer.echo("ledger sound: I1-I7 hold")


@auto_app.command("apply")
def automations_apply(
    block: Optional[str] = typer.Option(
        None, "--block", metavar="TYPE/NAME", help="Notification block to notify, e.g. slack-webhook/lane-alerts."
    ),
    block_id: Optional[str] = typer.Option(None, "--block-id", metavar="UUID", help="Or the block document's id."),
    file: str = typer.Option("deployments/automations.yaml", "--file", help="The automations file."),
):
    """Create the automations in the file on the Prefect API, with the block's id in place of its placeholder."""
    from pathlib import Path

    from . import automations

    if (block is None) == (block_id is None):
        from .errors import InvalidInput

        raise InvalidInput("--block", block, "give a notification block (--block TYPE/NAME or --block-id UUID)")
    for line in automations.apply(Path(file), block_id, block):
        typer.echo(line)


from .sim.command import simulate  # noqa: E402 - registered like the commands above

app.command("simulate")(simulate)
from .estimators.command import estimators_app  # noqa: E402

app.add_typer(estimators_app, name="estimators")


def main(argv: list[str] | None = None) -> None:
    """Entry point: every error is one line on stderr and a shell exit code."""
    try:  # newer typer vendors its own click; older ones use click itself
        from typer import _click as click
    except ImportError:  # pragma: no cover - depends on the installed typer
        import click

    from .ledger.url import redact

    args = hoist_db(list(sys.argv[1:] if argv is None else argv))
    try:
        code = app(args=args, prog_name="lane", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        help_text = exc.format_message()  # computed (and, by a rich console, already shown) once
        if help_text.strip():
            typer.echo(help_text)
        sys.exit(0)
    except click.ClickException as exc:
        typer.echo(f"lane: error: {' '.join(redact(with_value(exc)).split())}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        sys.exit(1)
    except LaneError as exc:
        typer.echo(f"lane: error: {' '.join(redact(str(exc)).split())}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()

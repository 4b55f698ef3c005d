"""The ``lane`` command line.

``submit``, ``tick`` and ``settle`` import neither Prefect nor pandas, so a
shell loop of them stays fast. Errors print one line and exit non-zero:
1 audit found violations, 2 bad input, 3 unknown lane, job or ledger, 4 never
fits, 5 wrong state (not leased, not parked), 6 conflicting replay, 7 parked,
8 database. ``--db`` may come before or after the command. Read-only commands
(``lanes``, ``status``, ``report``, ``tail``, ``audit``) never create a ledger.
"""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer

from .cli_text import DRIFT_COLUMNS, DRIFT_TITLE, drift_rows, duration, for_json, hoist_db, job_lines, with_value
from .errors import LaneError

# Plain click help (no rich boxes): switches show no <bool>, and it reads the same piped or not.
_PLAIN = dict(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False)
app = typer.Typer(
    help="Token-weighted admission for LLM pipelines: a ledger of lanes, jobs, leases and settlements. "
    "Exit codes: 1 audit violations, 2 bad input, 3 unknown lane, job or ledger, 4 never fits, "
    "5 wrong state, 6 conflicting replay, 7 parked, 8 database.",
    no_args_is_help=True, **_PLAIN,
)  # fmt: skip
lanes_app = typer.Typer(help="Show lanes (spent / reserved / remaining / overage), or change, create or delete one.",
                        invoke_without_command=True, **_PLAIN)  # fmt: skip
tail_app = typer.Typer(help="Parked jobs: list them, requeue one, or drop one.", invoke_without_command=True, **_PLAIN)
db_app = typer.Typer(help="The ledger's database schema.", no_args_is_help=True, **_PLAIN)
auto_app = typer.Typer(help="Prefect Automations that page on lane events.", no_args_is_help=True, **_PLAIN)
app.add_typer(lanes_app, name="lanes")
app.add_typer(tail_app, name="tail")
app.add_typer(db_app, name="db")
app.add_typer(auto_app, name="automations")

_state: dict = {"db": None}
JSON = typer.Option(False, "--json", help="Print JSON for scripts (times in ISO-8601 UTC).")


@app.callback()
def main_options(
    db: Optional[str] = typer.Option(
        None, "--db", metavar="URL",
        help="Ledger URL, or block:lane-ledger/NAME (default: $LANE_DATABASE_URL, else lane.db under "
        "PREFECT_HOME). May come before or after the command.", show_default=False,
    ),
):  # fmt: skip
    _state["db"] = db


def ledger(create: bool = True):
    """The ledger named by --db; ``create=False`` for read-only commands (a missing ledger is exit 3)."""
    from .ledger import Ledger

    return Ledger(_state["db"], create=create)


def _print_json(data) -> None:
    typer.echo(json.dumps(for_json(data), indent=2, default=str, ensure_ascii=False))


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    from rich.console import Console
    from rich.table import Table

    from .cli_text import as_blocks, table_width

    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped: do not fold numbers into 80 columns
    cells = [[("" if v is None else str(v)) for v in r] for r in rows]
    if rows and table_width(columns, cells) > console.width:  # a narrow terminal: a block per row, no number folded
        typer.echo("\n".join(as_blocks(title, columns, cells, console.width)))
        return
    table = Table(title=title)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in cells:
        table.add_row(*r)
    console.print(table)


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
    est_input: Optional[int] = typer.Option(None, help="Input tokens counted for this job (learned estimators learn "
                                            "actual minus this)."),
    as_json: bool = JSON,
):
    """Record a job; prints only its id on stdout, so id=$(lane submit ...) works (its attempt goes to stderr)."""
    fb = True if fallback == "lane" else fallback
    led = ledger()
    jid = led.submit(stage, est, lane, rate_cost=rate_cost, est_version=est_version, run_key=run_key, key=key,
                     wait_seconds=wait, fallback=fb, est_input=est_input)  # fmt: skip
    job = led.job(jid)  # a known --key may name a job already retried: say which attempt it is at
    if as_json:
        _print_json({"id": jid, "attempt": job["attempt"], "ref": f"{jid}:{job['attempt']}", "lane": job["lane"],
                     "state": job["state"]})  # fmt: skip
        return
    typer.echo(jid)
    typer.echo(f"job {jid} attempt {job['attempt']} ({job['state']} in lane {job['lane']}; "
               f"settle it as {jid}:{job['attempt']})", err=True)  # fmt: skip


@app.command()
def tick(lane: str = typer.Option("free", help="Lane to admit in."), as_json: bool = JSON):
    """Lease what fits now, in priority order (small first, age raising priority), within budget, burst and lease caps."""
    led = ledger()
    leases = led.tick(lane)
    ok, why = led.preflight.last(lane)
    if not ok:  # nothing admitted, and the reason is said, never a silent exit
        typer.echo(f"lane {lane}: preflight failed: {why}", err=True)
    if as_json:
        _print_json([{"id": x.job_id, "stage": x.stage, "est": x.est, "rate_cost": x.rate_cost, "lane": x.lane,
                      "attempt": x.attempt, "ref": f"{x.job_id}:{x.attempt}", "lease_until": x.lease_until,
                      "token": x.token} for x in leases])  # fmt: skip
        return
    for x in leases:
        typer.echo(f"{x.job_id}:{x.attempt}\t{x.stage}\t{x.est}\tattempt {x.attempt}")
    typer.echo(f"leased {len(leases)} jobs, {sum(x.est for x in leases)} tokens", err=True)


@app.command()
def settle(
    job_id: str = typer.Argument(..., help="Job to settle: ID:ATTEMPT as lane tick prints it, or a bare ID."),
    actual: int = typer.Option(..., help="Tokens really spent."),
    attempt: Optional[int] = typer.Option(
        None, help="Attempt (or ID:ATTEMPT). A bare ID means the job's only leased attempt; a job leased as "
        "several attempts refuses it (exit 2), so no attempt's tokens are billed to another."
    ),
    failed: bool = typer.Option(False, "--failed", help="The attempt failed (its tokens are still billed)."),
    as_json: bool = JSON,
):
    """Bill what an attempt really spent, exactly once (a replay bills nothing; another actual is exit 6)."""
    from dataclasses import asdict

    r = ledger().settle(job_id, actual, attempt=attempt, outcome="failed" if failed else "done")
    if as_json:
        _print_json(asdict(r))
        return
    notes = [n for n, on in (("replay: billed nothing", r.replay), ("late", r.late)) if on]
    over = f", overage {r.overage}" if r.overage else ""
    typer.echo(f"settled {r.job_id} attempt {r.attempt}: {r.actual} tokens{over}" + (f" ({', '.join(notes)})" if notes else ""))


@app.command()
def reap(
    overdue: bool = typer.Option(False, "--overdue", help="Also park jobs past their deadline and expire the tail."),
    as_json: bool = JSON,
):
    """Return expired leases to the queue (attempt + 1), or park them when attempts are exhausted."""
    led = ledger()
    moved = led.park_overdue() if overdue else led.reap()
    if as_json:
        _print_json({"requeued": moved.requeued, "parked": moved.parked, "expired": moved.expired})
        return
    typer.echo(f"requeued {len(moved.requeued)}, parked {len(moved.parked)}, expired {len(moved.expired)}")


@app.command()
def report(
    lane: Optional[str] = typer.Option(None, help="Only this lane."),
    since: Optional[str] = typer.Option(None, help="Only jobs finished within this span (24h, 7d...)."),
    by: str = typer.Option(
        "stage", help="Group by: stage, lane, est_version, or version (admission and shadow estimates), comma separated."
    ),
    fmt: str = typer.Option("table", "--format", help="table, csv, json or markdown."),
    plot: Optional[str] = typer.Option(None, "--plot", help="Also draw drift per stage over time to this PNG."),
):
    """Drift per stage: sum(actual) / sum(est) of done jobs, as in the article.

    With --by stage,version each shadow estimator sits beside the admission one on the same jobs.
    """
    led = ledger(create=False)
    if lane is not None:
        led.lane(lane)  # an unknown lane is exit 3, not an empty report
    from .reports import drift, drift_over_time, plot_drift, render, spend_over_time

    df = drift(led, lane=lane, since=since, by=by)
    if plot:
        plot_drift(drift_over_time(led, lane=lane, since=since), plot, spend=spend_over_time(led, lane=lane, since=since))
        typer.echo(f"plot written to {plot}", err=True)
    if df.empty and fmt == "table":
        typer.echo(f"no settled jobs in the ledger at {led.url}" + (f" in lane {lane}" if lane else "")
                   + (f" in the last {since}" if since else ""))  # fmt: skip
        return
    typer.echo(render(df, fmt))


@lanes_app.callback()
def lanes(ctx: typer.Context, as_json: bool = JSON):
    """Spent / reserved / remaining / overage per lane, % of ceiling, leased, waiting and parked."""
    if ctx.invoked_subcommand:
        return
    status = ledger(create=False).lanes()
    if as_json:
        _print_json(status)
        return
    from .ledger.status import blocked_state

    rows = []
    for s in status:
        flags = [f for f, on in (("STOPPED", s["stopped"]), ("ceiling-spent", s["hard_stopped"] and not s["stopped"]),
                                 (f"{s['start_fraction']:.0%} start limit: finishing only",
                                  s["starting_stopped"] and not s["hard_stopped"] and s["start_fraction"] < 1),
                                 (f"preflight failed: {s['preflight_error']}", not s["preflight_ok"])) if on]  # fmt: skip
        rows.append([s["lane"], f"{s['ceiling']:,}", f"{s['spent']:,}", f"{s['reserved']:,}", f"{s['remaining']:,}",
                     f"{s['overage']:,}", f"{s['pct_of_ceiling']:.1f}%", f"{s['leased']}/{s['max_leased']}",
                     s["waiting"], s["parked"], "; ".join(flags) or blocked_state(s) or "ok"])  # fmt: skip
    _table("lanes", ["lane", "ceiling", "spent", "reserved", "remaining", "overage", "% ceiling", "leased",
                     "waiting", "parked", "status"], rows)  # fmt: skip
    if drift := drift_rows(status):  # only lanes that learned an allowance: a table of its own, not 6 more columns
        _table(DRIFT_TITLE, DRIFT_COLUMNS, drift)


@lanes_app.command("set")
def lanes_set(
    name: str = typer.Argument(..., help="Lane to change (an unknown name is refused unless --create)."),
    create: bool = typer.Option(False, "--create", help="Create the lane if it does not exist (from the defaults)."),
    allowance: Optional[int] = typer.Option(None, help="The provider's allowance."),
    ceiling: Optional[int] = typer.Option(None, help="Never admit past this many tokens."),
    start_fraction: Optional[float] = typer.Option(
        None, help="Flat stop: share of the ceiling jobs that start a run may use (0.8: the article's)."
    ),
    burst_tokens: Optional[int] = typer.Option(None, help="Rate tokens admitted in any sliding window."),
    window_seconds: Optional[float] = typer.Option(None, help="Sliding burst window length."),
    rate_basis: Optional[str] = typer.Option(
        None, help="What the provider's rate limit counts: request (rate_cost) or actual (trued up at settle)."
    ),
    headroom_sigmas: Optional[float] = typer.Option(
        None, help="Keep this many standard deviations of the spread in flight (est_var) free under the ceiling."
    ),
    max_leased: Optional[int] = typer.Option(None, help="Leased jobs at most."),
    lease_seconds: Optional[float] = typer.Option(None, help="Lease length."),
    max_wait_seconds: Optional[float] = typer.Option(
        None, help="No job arriving this long after another is ever ahead of it (the wait bound)."
    ),
    max_attempts: Optional[int] = typer.Option(None, help="Lease expiries before a job is parked."),
    park_seconds: Optional[float] = typer.Option(None, help="How long a parked job stays in the tail."),
    fallback: Optional[str] = typer.Option(None, help="Fallback lane ('' for none)."),
    preflight: Optional[str] = typer.Option(None, help="http(s) URL, or the name of a check registered in code or in the lane_plugin.preflights entry point group ('' for none)."),
    preflight_timeout: Optional[float] = typer.Option(None, help="Seconds the preflight may take."),
    period: Optional[str] = typer.Option(None, help="Allowance reset: none, daily or monthly."),
    stop: Optional[bool] = typer.Option(None, "--stop/--resume", help="Hard-stop the lane, or resume it."),
    force: bool = typer.Option(False, "--force", help="Lower the ceiling even under what the lane already admitted "
                               "this period (it then admits nothing until its next reset)."),
    as_json: bool = JSON,
):
    """Change a lane's numbers, e.g. lane lanes set free --ceiling 6000000 (new lanes need --create)."""
    settings = {k: v for k, v in dict(
        allowance=allowance, ceiling=ceiling, start_fraction=start_fraction, burst_tokens=burst_tokens,
        window_seconds=window_seconds, rate_basis=rate_basis, max_leased=max_leased, lease_seconds=lease_seconds,
        max_wait_seconds=max_wait_seconds, max_attempts=max_attempts, park_seconds=park_seconds,
        fallback=fallback, preflight=preflight, preflight_timeout=preflight_timeout, period=period, stopped=stop,
        headroom_sigmas=headroom_sigmas,
    ).items() if v is not None}  # fmt: skip
    from .errors import UnknownLane

    try:
        row = ledger().set_lane(name, create=create, force=force, **settings)
    except UnknownLane as exc:
        if create or exc.details.get("lane") != name:
            raise
        raise UnknownLane(name, hint="a typo? to create a new lane, add --create") from None
    if as_json:
        from dataclasses import asdict

        _print_json(asdict(row))
        return
    typer.echo(f"lane {row.name}: ceiling {row.ceiling:,}, burst {row.burst_tokens:,} per {duration(row.window_seconds)}, "
               f"max leased {row.max_leased}, lease {duration(row.lease_seconds)}, fallback {row.fallback or '-'}")  # fmt: skip


@lanes_app.command("delete")
def lanes_delete(name: str = typer.Argument(..., help="Lane to delete: one no job ever used.")):
    """Delete a lane no job ever used (a typo); stop a used lane instead (lanes set NAME --stop)."""
    ledger(create=False).delete_lane(name)
    typer.echo(f"deleted lane {name}")


@lanes_app.command("clear-drift")
def lanes_clear_drift(name: str = typer.Argument(..., help="Lane whose learned drift allowance to forget.")):
    """Forget a lane's learned drift allowance (drift 1.0, overrun 0, spread 0), e.g. after a report_usage typo
    taught an outlier. Idempotent. The next refit (every 5 minutes) relearns it only from settlements after
    the clear: the ones before it, the outlier's among them, are not learned from again."""
    ledger(create=False).clear_drift(name)
    typer.echo(f"lane {name}: drift allowance cleared (drift 1.0, overrun 0, spread 0); the next refit learns "
               "only from settlements after this")  # fmt: skip


@app.command()
def status(
    job_id: Optional[str] = typer.Argument(None, help="A job: where it stands. Without one: every lane's state."),
    as_json: bool = JSON,
):
    """Each lane's state in words, or where one job stands (its place in the queue and what blocks it)."""
    led = ledger(create=False)
    if job_id is not None:
        s = led.wait_status(job_id)
        if as_json:
            _print_json(s)
            return
        for line in job_lines(s):
            typer.echo(line)
        return
    from .ledger.status import blocked_state, lane_state

    rows = []
    for s in led.lanes():
        state = lane_state(led.lane(s["lane"]))
        if state == "ok":  # a rule keeps the first waiting job out and nothing leased settles to make room
            state = blocked_state(s) or state
        rows.append({"lane": s["lane"], "state": state, "pct_of_ceiling": s["pct_of_ceiling"],
                     "remaining": s["remaining"], "waiting": s["waiting"], "parked": s["parked"], "leased": s["leased"],
                     "blocked_by": s["blocked_by"], "reason": s["blocked_reason"], "head_job": s["head_job"]})  # fmt: skip
    if as_json:
        _print_json(rows)
        return
    for r in rows:
        typer.echo(f"lane {r['lane']}: {r['state']}, {r['pct_of_ceiling']:.1f}% of ceiling committed, "
                   f"{r['remaining']:,} remaining, {r['waiting']} waiting, {r['parked']} parked")  # fmt: skip
        if r["blocked_by"]:  # why work waits: its first job in admission order, worded as `lane status JOB` does
            typer.echo("\n".join("  " + line for line in job_lines(led.wait_status(r["head_job"]))))


@tail_app.callback()
def tail(ctx: typer.Context, lane: Optional[str] = typer.Option(None, help="Only this lane."), as_json: bool = JSON):
    """List parked jobs with age, deadline and reason."""
    if ctx.invoked_subcommand:
        return
    led = ledger(create=False)
    if lane is not None:
        led.lane(lane)  # unknown lane: exit 3
    jobs = led.tail(lane)
    if as_json:
        _print_json(jobs)
        return
    now = led.now()
    _table(f"tail: {len(jobs)} parked", ["job", "lane", "stage", "est", "parked for", "expires in", "reason"],
           [[j["job_id"], j["lane"], j["stage"], f"{j['est']:,}", duration(j["age"]), duration(j["deadline"] - now),
             j["reason"]] for j in jobs])  # fmt: skip


@tail_app.command("requeue")
def tail_requeue(job_id: str = typer.Argument(..., help="A parked job.")):
    """Put a parked job back in the queue."""
    ledger().requeue(job_id)
    typer.echo(f"requeued {job_id}")


@tail_app.command("drop")
def tail_drop(job_id: str = typer.Argument(..., help="A parked job.")):
    """Fail a parked job for good."""
    ledger().drop(job_id)
    typer.echo(f"dropped {job_id}")


@db_app.command("upgrade")
def db_upgrade():
    """Create the ledger's tables, or upgrade them to this version's schema."""
    led = ledger()
    typer.echo(f"{led.url}: schema at revision {led.upgrade()}")


@app.command()
def audit(grace: float = typer.Option(60.0, help="Reap interval: how long a lease may outlive its expiry.")):
    """Check invariants I1-I6 from the tables; exits 1 naming each violation."""
    bad = ledger(create=False).audit(grace=grace)
    for line in bad:
        typer.echo(line)
    if bad:
        raise typer.Exit(1)
    typer.echo("ledger sound: I1-I6 hold")


@auto_app.command("apply")
def automations_apply(
    block: Optional[str] = typer.Option(None, "--block", metavar="TYPE/NAME",
                                        help="Notification block to notify, e.g. slack-webhook/lane-alerts."),
    block_id: Optional[str] = typer.Option(None, "--block-id", metavar="UUID", help="Or the block document's id."),
    file: str = typer.Option("deployments/automations.yaml", "--file", help="The automations file."),
):  # fmt: skip
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

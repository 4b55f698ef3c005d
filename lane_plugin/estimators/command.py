"""``lane estimators``: show and refit the learned estimators' state kept in the ledger.

Registered in :mod:`lane_plugin.cli` with ``app.add_typer(estimators_app, name="estimators")``.
Imports neither Prefect nor pandas. Neither command creates a ledger: on a missing one they
exit 3, as the other read-only commands do.

Example::

    lane estimators refit                 # learn from the newest settled jobs, store the state
    lane estimators show --json           # what every process estimating with `learned` uses now
"""

from __future__ import annotations

import json
import time
from typing import Optional

import typer

from ..cli_text import duration, iso

estimators_app = typer.Typer(
    help="Learned estimators: show or refit their state in the ledger.",
    no_args_is_help=True,
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
)
JSON = typer.Option(False, "--json", help="Print JSON for scripts (times in ISO-8601 UTC).")


def _ledger(ctx: typer.Context):
    """The ledger named by the root ``--db`` (``lane`` moves it to the front from anywhere), named first on
    stderr as every command's is; never created here."""
    from ..cli_common import ledger

    return ledger(create=False, db=ctx.find_root().params.get("db"))


COLUMNS = ["estimator", "stage", "allowance", "version", "jobs", "mean", "sd", "p50", "p90", "p99"]
COLUMNS += ["mean input", "fitted"]


@estimators_app.command("show")
def show(
    ctx: typer.Context,
    estimator: Optional[str] = typer.Option(None, help="Only this estimator (e.g. learned)."),
    as_json: bool = JSON,
    wide: bool = typer.Option(False, "--wide", help="Show every column, however wide (by default tables fit 100)."),
):
    """The fitted state per estimator and stage: allowance, version digest, and the spread of the residual."""
    from ..cli_common import print_table

    led = _ledger(ctx)
    rows = led.estimator_state(estimator)
    if as_json:
        typer.echo(json.dumps([dict(r, sd=_sd(r), fitted_at=iso(r["fitted_at"])) for r in rows], indent=2))
        return
    if not rows:
        typer.echo(
            f"no learned estimator state in {led.url}: jobs must settle with their input tokens recorded "
            "(estimate them with learned(), admitting or as a shadow), then run `lane estimators refit`"
        )
        return
    now = led.now()
    cells = []
    for r in rows:
        numbers = [r["mean"], _sd(r), r["p50"], r["p90"], r["p99"], r["mean_input"]]
        ago = duration(max(0.0, now - r["fitted_at"])) + " ago"
        cells.append(
            [r["estimator"], r["stage"], f"{r['allowance']:,}", "#" + r["revision"], f"{r['jobs']:,}"]
            + [f"{n:,.0f}" for n in numbers]
            + [ago]
        )
    right = set(COLUMNS) - {"estimator", "stage", "version", "fitted"}
    print_table("learned estimators", COLUMNS, cells, wide=wide, right=right, optional=["p50", "p99", "mean input"])


def _sd(row: dict) -> float:
    return (row["m2"] / (row["jobs"] - 1)) ** 0.5 if row["jobs"] > 1 else 0.0


@estimators_app.command("refit")
def refit_command(
    ctx: typer.Context,
    estimator: str = typer.Option("learned", help="The estimator's name (its state's key in the ledger)."),
    window: int = typer.Option(1000, help="Newest settled jobs per stage to learn from."),
    min_jobs: int = typer.Option(20, help="Settled jobs a stage needs before its allowance is learned."),
    tolerance: float = typer.Option(0.01, help="Share of a stage's mean job size the mean must move to change it."),
    lane: Optional[str] = typer.Option(None, help="Learn only from this lane's jobs."),
    as_json: bool = JSON,
):
    """Learn each stage's output allowance from the newest settled jobs and store it for every process."""
    from .learned import refit

    led = _ledger(ctx)
    if lane is not None:
        led.lane(lane)  # an unknown lane is exit 3, not 'nothing to learn from'
    t0 = time.perf_counter()
    result = refit(led, estimator=estimator, window=window, min_jobs=min_jobs, tolerance=tolerance, lane=lane)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "estimator": result.estimator,
                    "before": result.before,
                    "after": result.after,
                    "changed": {s: {"from": a, "to": b} for s, (a, b) in result.changed.items()},
                    "stages": {s: dict(f.row(result.after), sd=f.std) for s, f in result.fits.items()},
                },
                indent=2,
            )
        )
        return
    if not result.fits:
        typer.echo(f"{estimator}: {result.outcome().replace(':', f' in {led.url}:', 1)}")
        return
    for line in result.lines():
        typer.echo(f"{estimator} {line}")
    typer.echo(f"{estimator}: {result.outcome()} ({time.perf_counter() - t0:.2f}s)")


__all__ = ["estimators_app"]

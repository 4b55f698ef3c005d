"""``lane lanes`` (show, set, delete, clear-drift) and ``lane status [LANE|JOB]``: lanes as people read them.

A lane's state in one word (:func:`lane_plugin.ledger.status.status_word`): ``stopped``,
``preflight-failed``, ``ceiling-spent``, ``finishing-only``, ``blocked by RULE``, ``attention`` (parked
work, or attempts that failed in the last hour: never ``ok``), or ``ok``.
"""

from __future__ import annotations

import time
from typing import Optional

import typer

from .cli_common import JSON, PLAIN, WIDE, echo_wrapped, ledger, print_json, print_table
from .cli_text import DRIFT_COLUMNS, DRIFT_TITLE, drift_rows, duration, iso, job_lines
from .errors import InvalidInput, UnknownJob, UnknownLane

lanes_app = typer.Typer(
    help="Show lanes (spent / reserved / remaining / overage), or change, create or delete one.",
    invoke_without_command=True,
    **PLAIN,
)
LANE_COLUMNS = [
    "lane",
    "ceiling",
    "spent",
    "reserved",
    "remaining",
    "overage",
    "% ceiling",
    "leased",
    "waiting",
    "parked",
    "limits",
    "status",
]
PARKED_SHOWN = 5  # lane status LANE lists this many parked jobs, then says how many more


def _flags(s: dict) -> list[str]:
    """What stops or limits a lane, as the ``lane lanes`` status column says it."""
    return [
        f
        for f, on in (
            ("STOPPED", s["stopped"]),
            ("ceiling-spent", s["hard_stopped"] and not s["stopped"]),
            (
                f"{s['start_fraction']:.0%} start limit: finishing only",
                s["starting_stopped"] and not s["hard_stopped"] and s["start_fraction"] < 1,
            ),
            (f"preflight failed: {s['preflight_error']}", not s["preflight_ok"]),
        )
        if on
    ]


def lane_status_cell(s: dict) -> str:
    """The ``status`` column of ``lane lanes``: what stops the lane, what blocks it, what needs attention, or ok."""
    from .ledger.status import blocked_state

    if flags := _flags(s):
        return "; ".join(flags)
    if s.get("paused_until") is not None:
        return s["held_back"]
    if blocked := blocked_state(s):
        return blocked
    trouble = [f"{s['parked']} parked"] if s["parked"] else []
    if s["failed_last_hour"]:
        trouble.append(f"{s['failed_last_hour']} failed in 1h")
    return f"attention: {', '.join(trouble)}" if trouble else "ok"


@lanes_app.callback()
def lanes(ctx: typer.Context, as_json: bool = JSON, wide: bool = WIDE):
    """Spent / reserved / remaining / overage per lane, % of ceiling, leased, waiting, parked and a status.

    The status is what stops or limits the lane (STOPPED, ceiling-spent, a start limit, a failed preflight),
    the rule that keeps its first waiting job out when nothing leased will settle (blocked by RULE), its
    parked work or failed attempts of the last hour (attention: never ok), or ok.
    """
    if ctx.invoked_subcommand:
        return
    status = ledger(create=False).lanes()
    if as_json:
        print_json(status)
        return
    rows = [
        [
            s["lane"],
            f"{s['ceiling']:,}",
            f"{s['spent']:,}",
            f"{s['reserved']:,}",
            f"{s['remaining']:,}",
            f"{s['overage']:,}",
            f"{s['pct_of_ceiling']:.1f}%",
            f"{s['leased']}/{s['max_leased']}",
            s["waiting"],
            s["parked"],
            ", ".join(s["limits"]) or "-",
            lane_status_cell(s),
        ]
        for s in status
    ]
    numbers = set(LANE_COLUMNS[1:-1])
    numbers.discard("limits")
    print_table(
        "lanes", LANE_COLUMNS, rows, wide=wide, right=numbers, optional=["remaining", "reserved", "overage", "limits"]
    )
    if drift := drift_rows(status):  # only lanes that learned an allowance: a table of its own, not 6 more columns
        print_table(DRIFT_TITLE, DRIFT_COLUMNS, drift, wide=wide, right=set(DRIFT_COLUMNS[1:]))


@lanes_app.command("set")
def lanes_set(
    name: str = typer.Argument(..., help="Lane to change (an unknown name is refused unless --create)."),
    create: bool = typer.Option(False, "--create", help="Create the lane if it does not exist (from the defaults)."),
    allowance: Optional[int] = typer.Option(None, help="The provider's allowance."),
    ceiling: Optional[int] = typer.Option(None, help="Never admit past this many tokens."),
    start_fraction: Optional[float] = typer.Option(
        None, help="Flat stop: share of the ceiling jobs that start a run may use (0.8: the article's)."
    ),
    limit: Optional[list[str]] = typer.Option(
        None,
        "--limit",
        metavar="UNIT=AMOUNT/WINDOW",
        help="A sliding-window limit as the provider states it, repeatable: requests=500/60s, tokens=30000/60s "
        "(the burst window), input_tokens=..., output_tokens=8000/60s; UNIT=none drops one.",
    ),
    burst_tokens: Optional[int] = typer.Option(None, help="Rate tokens admitted in any sliding window."),
    window_seconds: Optional[float] = typer.Option(None, help="Sliding burst window length."),
    rate_basis: Optional[str] = typer.Option(
        None, help="What the provider's rate limit counts: request (rate_cost) or actual (trued up at settle)."
    ),
    headroom_sigmas: Optional[float] = typer.Option(
        None, help="Keep this many standard deviations of the spread in flight (est_var) free under the ceiling."
    ),
    overtake_slack: Optional[str] = typer.Option(
        None,
        help="Rule 12: keep the p99 of the tokens admitted ahead of a job within this many times first come, first "
        "served's (1 to 10; default 1.25; 'off' turns it off). It binds once it has learned the lane's "
        "p99 backlog from a day of arrivals. docs/admission.md.",
    ),
    overtake_q: Optional[str] = typer.Option(
        None,
        help="Rule 12's p99 backlog in rate tokens, seeded (from a lane like it; 0: the pointwise keys) so it binds "
        "at once until a day is learned; 'learn' forgets it and learns a day afresh.",
    ),
    max_leased: Optional[int] = typer.Option(None, help="Leased jobs at most."),
    lease_seconds: Optional[float] = typer.Option(None, help="Lease length."),
    max_wait_seconds: Optional[float] = typer.Option(
        None, help="No job arriving this long after another is ever ahead of it (the wait bound)."
    ),
    max_attempts: Optional[int] = typer.Option(None, help="Lease expiries before a job is parked."),
    park_seconds: Optional[float] = typer.Option(None, help="How long a parked job stays in the tail."),
    fallback: Optional[str] = typer.Option(None, help="Fallback lane ('' for none)."),
    preflight: Optional[str] = typer.Option(
        None,
        help="http(s) URL, or the name of a check registered in code or "
        "in the lane_plugin.preflights entry point group ('' for none).",
    ),
    preflight_timeout: Optional[float] = typer.Option(None, help="Seconds the preflight may take."),
    period: Optional[str] = typer.Option(None, help="Allowance reset: none, daily or monthly."),
    stop: Optional[bool] = typer.Option(None, "--stop/--resume", help="Hard-stop the lane, or resume it."),
    force: bool = typer.Option(
        False,
        "--force",
        help="Lower the ceiling even under what the lane already admitted "
        "this period (it then admits nothing until its next reset).",
    ),
    as_json: bool = JSON,
):
    """Change a lane's numbers, e.g. lane lanes set free --ceiling 6000000 (new lanes need --create)."""
    settings = {
        k: v
        for k, v in dict(
            allowance=allowance,
            ceiling=ceiling,
            start_fraction=start_fraction,
            burst_tokens=burst_tokens,
            window_seconds=window_seconds,
            rate_basis=rate_basis,
            max_leased=max_leased,
            lease_seconds=lease_seconds,
            max_wait_seconds=max_wait_seconds,
            max_attempts=max_attempts,
            park_seconds=park_seconds,
            fallback=fallback,
            preflight=preflight,
            preflight_timeout=preflight_timeout,
            period=period,
            stopped=stop,
            headroom_sigmas=headroom_sigmas,
            overtake_slack=_slack(overtake_slack),
            overtake_q=_seed(overtake_q),
        ).items()
        if v is not None
    }
    if settings.get("overtake_q") is _LEARN:
        settings["overtake_q"] = None  # (the ledger reads None as: forget it, learn a day afresh)
    from .ledger.limits_api import check_limits

    parked: list[dict] = []

    if limit:
        settings["limits"] = check_limits(limit)  # a bad one is named before the ledger is opened
        both = [f"--{k.replace('_', '-')}" for k in ("burst_tokens", "window_seconds") if k in settings]
        if "tokens" in settings["limits"] and both:  # the tokens limit is the burst window: which was meant?
            spec = next(x for x in limit if x.strip().startswith("tokens"))
            raise InvalidInput("limit", spec, f"and {' and '.join(both)} both set the tokens window: choose one")
    try:
        row = ledger().set_lane(name, create=create, force=force, parked=parked, **settings)
    except UnknownLane as exc:
        if create or exc.details.get("lane") != name:
            raise
        known = [exc.suggestion] if exc.suggestion else []
        hint = "to create a new lane, add --create" if known else "a typo? to create a new lane, add --create"
        raise UnknownLane(name, hint=hint, known=known) from None
    if as_json:
        from dataclasses import asdict

        from .policy.limits import format_limit

        print_json(
            {
                **asdict(row),
                "limits": [format_limit(x) for x in row.policy.all_limits],
                "parked": [t["job_id"] for t in parked],
            }
        )
        return
    typer.echo(
        f"lane {row.name}: ceiling {row.ceiling:,}, {_limits_text(row)}, "
        f"max leased {row.max_leased}, lease {duration(row.lease_seconds)}, fallback {row.fallback or '-'}"
        + (
            ""
            if row.overtake_slack is None
            else f", {_slack_text(row.overtake_slack, row.overtake_q, row.overtake_since)}"
        )
    )
    if parked:  # said, not left to be found: the change took these jobs out of the queue
        why = parked[0]["reason"].split(": ", 1)[-1]
        typer.echo(
            f"parked {len(parked)} waiting job(s) the new settings leave no way to fit (the first: {why}); "
            f"lane tail --lane {row.name} lists them"
        )


def _limits_text(row) -> str:
    """``burst 30,000 per 1m, limits requests 500/60s, output_tokens 8000/60s`` of a lane row (the tokens
    limit is the burst window)."""
    from .policy.limits import NO_TOKENS_LIMIT, format_limit

    burst = (
        f"burst {row.burst_tokens:,} per {duration(row.window_seconds)}"
        if row.burst_tokens < NO_TOKENS_LIMIT
        else "no tokens limit"
    )
    others = [format_limit(x) for x in row.policy.limits]
    return burst + (", limits " + ", ".join(others) if others else "")


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
    typer.echo(
        f"lane {name}: drift allowance cleared (drift 1.0, overrun 0, spread 0); the next refit learns "
        "only from settlements after this"
    )


def _row(s: dict) -> dict:
    """One lane of ``lane status --json``."""
    from .ledger.status import status_word, work_trouble

    return {
        "lane": s["lane"],
        "state": status_word(s),
        "attention": work_trouble(s),
        "pct_of_ceiling": s["pct_of_ceiling"],
        "remaining": s["remaining"],
        "waiting": s["waiting"],
        "parked": s["parked"],
        "failed_last_hour": s["failed_last_hour"],
        "leased": s["leased"],
        "blocked_by": s["blocked_by"],
        "reason": s["blocked_reason"],
        "head_job": s["head_job"],
        "limits": s["limits"],
        "held_back": s["held_back"],
        "paused_until": s["paused_until"],
    }


def _line(r: dict) -> str:
    state = f"{r['state']} ({r['attention']})" if r["state"] == "attention" else r["state"]
    held = f"; held back: {r['held_back']}" if r.get("held_back") else ""
    return (
        f"lane {r['lane']}: {state}, {r['pct_of_ceiling']:.1f}% of ceiling committed, {r['remaining']:,} "
        f"remaining, {r['waiting']} waiting, {r['parked']} parked{held}"
    )


def _lane_view(led, s: dict, as_json: bool) -> None:
    """``lane status LANE``: its state, its numbers, its parked jobs with their reasons, its first waiting job."""
    parked = led.tail(s["lane"])
    tenants = led.tenants(s["lane"])
    if as_json:
        print_json({**s, **_row(s), "parked_jobs": parked, "tenants": tenants})
        return
    lines = [
        _line(_row(s)),
        f"  spent {s['spent']:,} + reserved {s['reserved']:,} of ceiling {s['ceiling']:,} (allowance "
        f"{s['allowance']:,}, overage {s['overage']:,}, period {s['period']})",
        f"  leased {s['leased']}/{s['max_leased']}, burst {s['burst_tokens']:,} per {duration(s['window_seconds'])} "
        f"(used {s['window_used']:,}), fallback {s['fallback'] or '-'}",
    ]
    if s["limit_use"]:
        lines.append("  limits: " + ", ".join(f"{u['limit']} (used {u['used']:,})" for u in s["limit_use"]))
    if s["overtake_slack"] is not None:
        lines.append(f"  {_slack_text(s['overtake_slack'], s['overtake_q'], s['overtake_since'])}")
    if len(tenants) > 1 or any(t["ceiling"] is not None or t["weight"] != 1 for t in tenants):
        lines.append(
            "  tenants (shared fairly by tokens; lane tenants "
            + s["lane"]
            + " for more): "
            + ", ".join(
                f"{t['tenant']} {t['waiting']} waiting, {t['reserved']:,} reserved"
                + (f", weight {t['weight']:g}" if t["weight"] != 1 else "")
                + (f", spent {t['spent']:,} of {t['ceiling']:,}" if t["ceiling"] is not None else "")
                for t in tenants
            )
        )
    for j in parked[:PARKED_SHOWN]:
        lines.append(
            f"  parked {duration(j['age'])} ago: job {j['job_id']} ({j['stage']}, estimate {j['est']:,}): {j['reason']}"
        )
    if parked:
        more = f"{len(parked) - PARKED_SHOWN} more; " if len(parked) > PARKED_SHOWN else ""
        lines.append(f"  ({more}lane tail --lane {s['lane']} lists them; lane status JOB says where one stands)")
    if s["failed_last_hour"]:
        lines.append(
            f"  {s['failed_last_hour']} attempt(s) failed in the last hour (their task raised): see the "
            "Prefect task runs' logs"
        )
    if s["head_job"]:  # the first waiting job in admission order, worded as `lane status JOB` does
        lines += ["  first waiting job:"] + ["    " + line for line in job_lines(led.wait_status(s["head_job"]))]
    echo_wrapped(lines)


def status(
    target: Optional[str] = typer.Argument(
        None,
        metavar="[LANE|JOB]",
        help="A lane: its state, numbers, parked jobs and first waiting job. A job: "
        "where it stands (a parked one: why). Neither: every lane's state.",
        show_default=False,
    ),
    as_json: bool = JSON,
):
    """Each lane's state in words, or one lane's (its parked work and what keeps its work waiting), or where one
    job stands (its place in the queue and what blocks it; why it was parked).

    A lane with parked work or attempts that failed in the last hour is never ok: it says attention.
    """

    led = ledger(create=False)
    all_lanes = led.lanes()
    if target is not None:
        found = next((s for s in all_lanes if s["lane"] == target), None)
        if found is not None:
            _lane_view(led, found, as_json)
            return
        try:
            s = led.wait_status(target)
        except UnknownJob:
            known = [x["lane"] for x in all_lanes]
            hint = "lane lanes lists the lanes, lane tail the parked jobs"
            raise UnknownLane(target, hint=hint, known=known, what="lane or job") from None
        if as_json:
            print_json(s)
            return
        echo_wrapped(job_lines(s))
        return
    rows = [_row(s) for s in all_lanes]
    if as_json:
        print_json(rows)
        return
    lines = []
    for r in rows:
        lines.append(_line(r))
        if r["blocked_by"]:  # why work waits: its first job in admission order, worded as `lane status JOB` does
            lines += ["  " + line for line in job_lines(led.wait_status(r["head_job"]))]
    echo_wrapped(lines)


__all__ = ["lanes_app", "status"]


def _slack(text: str | None) -> float | str | None:
    """``--overtake-slack``: a number (its range is the ledger's check), or ``off``."""
    if text is None or text.strip().lower() == "off":
        return None if text is None else "off"
    try:
        if not text.isascii() or "_" in text:
            raise ValueError(text)  # (float() reads other scripts' digits, and 1_2.5 as 12.5)
        return float(text)
    except ValueError:
        raise InvalidInput("overtake_slack", text, "expected a number from 1 to 10, or off") from None


_LEARN = object()  # --overtake-q learn: forget the seed (None once past the filter of unset options)


def _seed(text: str | None):
    """``--overtake-q``: a whole number of rate tokens in ASCII digits (its range is the ledger's check), or
    ``learn``."""
    if text is None:
        return None
    word = text.strip()
    if word.lower() == "learn":
        return _LEARN
    if word.isascii() and (word.isdecimal() or word[:1] == "-" and word[1:].isdecimal()):
        return int(word)
    raise InvalidInput("overtake_q", text, "expected a whole number of rate tokens (0 or more), or learn")


def _slack_text(slack: float, q: int | None, since: float | None) -> str:
    """Rule 12 in words (its bound is on the rate tokens admitted ahead of a job, docs/admission.md)."""
    from .policy.slack import LEARN_SECONDS

    if q is None and since is not None and since + LEARN_SECONDS > time.time():  # the learning day
        learned = f"learning the p99 backlog from the arrivals until {iso(since + LEARN_SECONDS)}: binds once learned"
    elif q is None and since is None:  # no date (a row written by hand): its day starts at the lane's next refit
        learned = "learning the p99 backlog from the lane's next refit on: binds a day later"
    elif q is None:  # the day is over: the next refit learns it once a day's arrivals number 200
        learned = "learning the p99 backlog: binds once a day has 200 arrivals (a refit every 5 minutes)"
    else:
        learned = f"p99 backlog {q:,} rate tokens"
    return f"rule 12: p99 of tokens ahead within {slack:g}x first come, first served's ({learned})"

"""How the ``lane`` command shows things: durations in words, times in ISO-8601 UTC, ``--db`` anywhere.

Example:
    >>> duration(86340), duration(95), duration(0.4), duration(-30)
    ('23h 59m', '1m 35s', '0s', 'overdue by 30s')
    >>> iso(0)
    '1970-01-01T00:00:00Z'
    >>> hoist_db(["lanes", "--db", "sqlite:///x.db"])
    ['--db', 'sqlite:///x.db', 'lanes']
"""

from __future__ import annotations

import textwrap
import time

from .policy.drift import drift_cap

# Keys whose values are epoch seconds: shown as ISO-8601 UTC in --json output.
TIME_KEYS = frozenset(
    {
        "lease_until",
        "deadline",
        "parked_at",
        "preflight_at",
        "created_at",
        "wait_since",
        "overtake_since",
        "admitted_at",
        "finished_at",
        "settled_at",
        "updated_at",
        "period_start",
        "window_start",
        "drift_cleared_at",
    }
)
# Keys whose values are seconds of duration: renamed with their unit in --json output.
DURATION_KEYS = {"age": "age_seconds"}


def duration(seconds: float) -> str:
    """A span in words, largest two units: ``2d 3h``, ``23h 59m``, ``1m 35s``, ``45s``."""
    s = float(seconds)
    if s < 0:
        return "overdue by " + duration(-s)
    s = int(s)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size or (unit == "s" and not parts):
            n, s = divmod(s, size)
            parts.append(f"{n}{unit}")
    return " ".join(parts[:2])


def iso(epoch: float | None) -> str | None:
    """Epoch seconds as ISO-8601 UTC (``2026-05-01T12:00:00Z``, milliseconds when there are any)."""
    if epoch is None:
        return None
    epoch = float(epoch)
    if epoch <= 0:
        return None if epoch < 0 else "1970-01-01T00:00:00Z"
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(epoch))
    ms = int(round((epoch - int(epoch)) * 1000))
    return f"{whole}.{ms:03d}Z" if ms and ms < 1000 else f"{whole}Z"


def for_json(data):
    """Times as ISO-8601 UTC and durations named with their unit, recursively."""
    if isinstance(data, list):
        return [for_json(x) for x in data]
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if k in TIME_KEYS and isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = iso(v) if v else None
            elif k in DURATION_KEYS and isinstance(v, (int, float)):
                out[DURATION_KEYS[k]] = round(float(v), 3)
            else:
                out[k] = for_json(v)
        return out
    return data


# The drift allowance table of `lane lanes`: beside the lanes table (which is wide already), readable at 80 columns.
DRIFT_TITLE = "drift allowance"
DRIFT_COLUMNS = ["lane", "drift", "overrun", "spread/job", "cap"]


def drift_rows(status: list[dict]) -> list[list[str]]:
    """The drift allowance of each lane that learned one (``Ledger.lanes()`` rows), for :data:`DRIFT_COLUMNS`.

    What the lane learned at its last refit: ``drift`` the factor estimates in flight are charged at,
    ``overrun`` kept free once and ``spread`` per job in flight; ``cap`` the most the allowance ever keeps
    free (5% of the ceiling). Empty if no lane learned any (``--json`` has them all, and ``drift_allowance``:
    what it keeps free for the jobs in flight now).

    Example:
        >>> drift_rows([{"lane": "d", "drift": 11.8182, "drift_overrun": 108181, "drift_spread": 0,
        ...              "ceiling": 200000}, {"lane": "free", "drift": 1.0, "drift_overrun": 0, "drift_spread": 0,
        ...              "ceiling": 10}])
        [['d', '11.8182x', '108,181', '0', '10,000']]
    """
    return [
        [
            s["lane"],
            f"{s['drift']:g}x",
            f"{s['drift_overrun']:,}",
            f"{s['drift_spread']:,}",
            f"{drift_cap(s['ceiling']):,}",
        ]
        for s in status
        if s["drift"] > 1.0 or s["drift_overrun"] or s["drift_spread"]
    ]


def why_waiting(s: dict) -> str:
    """What keeps a waiting job out, in words (``s`` is its ``Ledger.wait_status``).

    Example:
        >>> why_waiting({"blocked_by": None, "position": 1}), why_waiting({"blocked_by": None, "position": 3})
        ('it fits: the next tick leases it', 'behind 2 jobs')
    """
    ahead = s["position"] - 1
    if s["blocked_by"]:
        return f"blocked by {s['blocked_by']}"
    return f"behind {ahead} job{'s' * (ahead != 1)}" if ahead else "it fits: the next tick leases it"


# How a parked gated job (a Prefect task run's, a waiter waited for it) comes back: not by requeue.
GATED_BACK = "a gated job: its task submits it again when its flow run is re-run (lane tail requeue cannot)"


def job_lines(s: dict) -> list[str]:
    """Where one job stands, in words (``lane status JOB``; ``s`` is its ``Ledger.wait_status``).

    A waiting job's place and the first rule that blocks it, then, when it cannot fit before the next
    reset (or ever), why (its ``reason``, as ``--json`` gives it). ``lane status`` shows a lane's first
    waiting job this way when a rule keeps it out. A parked job: why it was parked, and how it comes back.

    Example:
        >>> job_lines({"job_id": "j1", "stage": "s", "est": 10, "state": "parked", "lane": "q", "gated": False,
        ...            "reason": "deadline passed while waiting"})[0]
        'job j1 (s, estimate 10) is parked in lane q: deadline passed while waiting'
    """
    tenant = f", tenant {s['tenant']}" if s.get("tenant") not in (None, "default") else ""
    job = f"job {s['job_id']} ({s['stage']}, estimate {s['est']:,}{tenant})"
    if s["state"] == "leased" and s.get("lease_left") is not None:
        left = s["lease_left"]
        if s["lease_expired"]:
            where = (
                "parks it (its waiter stopped renewing: waiter gone)"
                if s.get("gated")
                else "takes it back (to the queue for another attempt, or parked after the lane's max attempts)"
            )
            return [
                f"{job} was leased in lane {s['lane']} (attempt {s['attempt']}), but its lease expired "
                f"{duration(-left)} ago: the next reap (lane reap, or a waiting gate's periodic check) "
                f"{where}"
            ]
        return [
            f"{job} is leased in lane {s['lane']} (attempt {s['attempt']}), lease ends in {duration(left) if left >= 10 else f'{left:.1f}s'}"
        ]
    if s["state"] == "parked":
        lines = [f"{job} is parked in lane {s['lane']}: {s.get('reason') or 'no reason recorded'}"]
        if s.get("gated"):
            retry = f"prefect flow-run retry {s['run_key']}" if s.get("run_key") else "re-run its flow"
            return lines + [f"  {GATED_BACK}:", f"    {retry}", f"  to fail it for good: lane tail drop {s['job_id']}"]
        requeue, drop = f"lane tail requeue {s['job_id']}", f"lane tail drop {s['job_id']}"
        return lines + [f"  back in the queue: {requeue}", f"  failed for good:   {drop}"]
    if s["state"] != "new":
        why = f": {s['reason']}" if s.get("reason") else ""
        return [f"{job} is {s['state']} in lane {s['lane']}{why}"]
    lines = [
        f"{job} waits in lane {s['lane']}: position {s['position']} of {s['waiting']}, {why_waiting(s)}; "
        f"{s['remaining']:,} of {s['ceiling']:,} tokens remaining"
    ]
    return lines + ([f"  {s['reason']}"] if s["reason"] else [])


def hoist_db(args: list[str]) -> list[str]:
    """Move ``--db URL`` (or ``--db=URL``) from anywhere before ``--`` to the front, where click reads it."""
    out, db = [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        if a == "--db" and i + 1 < len(args):
            db = ["--db", args[i + 1]]
            i += 2
            continue
        if a.startswith("--db="):
            db = [a]
            i += 1
            continue
        out.append(a)
        i += 1
    return db + out


def with_value(exc: Exception) -> str:
    """Click's message, with the rejected value where newer Typer's (pydantic's) message leaves it out.

    ``Invalid value for '--est': Input should be a valid integer`` becomes ``... '--est' 'abc': Input ...``.
    """
    message = exc.format_message()  # type: ignore[attr-defined]
    errors = getattr(exc.__cause__, "errors", None)
    try:
        value = errors()[0]["input"] if callable(errors) else None
    except (IndexError, KeyError, TypeError):
        value = None
    if value is None or repr(value) in message:
        return message
    head, sep, tail = message.partition(": ")
    return f"{head} {value!r}{sep}{tail}" if sep else f"{message} (value {value!r})"


def table_width(columns: list[str], rows: list[list[str]]) -> int:
    """Columns a boxed table needs with no cell folded but the last column's (a reason may fold; a number not)."""
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(columns[:-1])]
    return sum(w + 3 for w in widths) + min(12, max([len(columns[-1])] + [len(r[-1]) for r in rows])) + 4


def as_blocks(title: str, columns: list[str], rows: list[list[str]], width: int) -> list[str]:
    """A table too wide for the terminal as one block per row: its first cell, then ``column value`` pairs.

    Example:
        >>> as_blocks("lanes", ["lane", "ceiling", "spent"], [["free", "8,000,000", "0"]], 24)
        ['lanes', 'free', '  ceiling 8,000,000', '  spent 0']
    """
    out = [title]
    for r in rows:
        out.append(r[0])
        line = ""
        for h, v in zip(columns[1:], r[1:]):
            item = f"{h} {v}"
            if line and len(line) + 3 + len(item) > width - 2:
                out.append("  " + line)
                line = ""
            if len(item) > width - 2:  # a long text (a reason) on lines of its own, wrapped between words
                out.extend(textwrap.wrap(item, width=width, initial_indent="  ", subsequent_indent="    "))
                continue
            line = f"{line} · {item}" if line else item
        if line:
            out.append("  " + line)
    return out

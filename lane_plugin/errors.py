"""Every error the library raises on purpose derives from :class:`LaneError`.

Each class's docstring is its default message; a raise site adds the field and
the value that were wrong. The CLI prints ``str(error)`` on one line and exits
with the class's ``exit_code``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def _shown(value: object) -> str:
    """A value as it appears in a message: repr, cut to 80 characters (input may be 10 kB)."""
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


class LaneError(Exception):
    """The token ledger refused the request."""

    exit_code = 1

    def __init__(self, message: str | None = None, **details: Any) -> None:
        self.details = details
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(LaneError):
    """A value is not acceptable."""

    exit_code = 2

    def __init__(self, field: str, value: object, why: str) -> None:
        super().__init__(f"invalid {field} {_shown(value)}: {why}", field=field, value=value)
        self.field = field


class UnknownLane(LaneError):
    """No such lane.

    ``known``: the lanes there are; the closest to ``name`` (difflib) is suggested, and kept as ``suggestion``.
    ``what``: what ``name`` was taken for (``lane status NAME`` takes a lane or a job).

    Example:
        >>> str(UnknownLane("mylan", known=["free", "mylane", "paid"]))
        "unknown lane 'mylan' (did you mean 'mylane'? lane lanes lists them)"
    """

    exit_code = 3

    def __init__(
        self, name: str, hint: str = "lane lanes lists them", known: Iterable[object] = (), what: str = "lane"
    ) -> None:
        import difflib

        close = difflib.get_close_matches(str(name), [str(k) for k in known], n=1) if isinstance(name, str) else []
        self.suggestion = close[0] if close else None
        guess = f"did you mean {self.suggestion!r}? " if self.suggestion else ""
        super().__init__(f"unknown {what} {_shown(name)} ({guess}{hint})", lane=name, suggestion=self.suggestion)


class UnknownTenant(LaneError):
    """No such tenant in the lane (``lane tenants set`` without ``--create``; exit 3, as an unknown lane).

    ``known``: the lane's tenants; the closest to ``name`` (difflib) is suggested, and kept as ``suggestion``.

    Example:
        >>> str(UnknownTenant("interactiv", "free", known=["backfill", "interactive"]))
        "unknown tenant 'interactiv' in lane 'free' (did you mean 'interactive'? --create adds it; lane tenants free lists them)"
    """

    exit_code = 3

    def __init__(self, name: str, lane: str, known: Iterable[str] = ()) -> None:
        import difflib

        close = difflib.get_close_matches(name, list(known), n=1)
        self.suggestion = close[0] if close else None
        guess = f"did you mean {self.suggestion!r}? " if self.suggestion else ""
        super().__init__(
            f"unknown tenant {_shown(name)} in lane {_shown(lane)} ({guess}--create adds it; lane tenants {lane} lists them)",
            tenant=name,
            lane=lane,
            suggestion=self.suggestion,
        )


class UnknownJob(LaneError):
    """No such job."""

    exit_code = 3

    def __init__(self, job_id: str):
        super().__init__(f"unknown job {_shown(job_id)}", job_id=job_id)


class NeverFits(LaneError):
    """The job's estimate can never be admitted in this lane."""

    exit_code = 4


class NotLeased(LaneError):
    """The job holds no lease for this attempt."""

    exit_code = 5


class NotParked(LaneError):
    """The job is not parked (only parked jobs can be requeued or dropped)."""

    exit_code = 5


class GatedJob(LaneError):
    """The job is a gated Prefect task run's: its task submits it again when its flow run is re-run.

    ``lane tail requeue`` refuses it: requeued, nobody would wait for it and it would be parked again
    (``waiter gone``) a few seconds later.
    """

    exit_code = 5


class LeaseLost(LaneError):
    """The lease is no longer held (it expired and was reaped, or the job moved on)."""

    exit_code = 5


class ConflictingReplay(LaneError):
    """The same idempotency key was sent again with different values."""

    exit_code = 6


class AmbiguousAttempt(LaneError):
    """The settlement names no attempt and the job has had several: which one spent the tokens?"""

    exit_code = 2


class JobParked(LaneError):
    """The job was parked before it could be admitted."""

    exit_code = 7


class DatabaseError(LaneError):
    """The ledger database could not be used."""

    exit_code = 8


class NoLedger(LaneError):
    """There is no ledger at this URL."""

    exit_code = 3


class NotALedger(DatabaseError):
    """The database exists but is not a lane ledger."""


class UnknownRevision(DatabaseError):
    """The ledger's schema is at an Alembic revision this lane_plugin does not know."""

    def __init__(self, where: str, revision: str, known: list[str]):
        super().__init__(
            f"{where}: schema at unknown Alembic revision {_shown(revision)} (this lane_plugin knows "
            f"{', '.join(known)}): a newer lane_plugin wrote it, or it is another application's database; "
            "upgrade lane_plugin or point --db/LANE_DATABASE_URL at a lane ledger",
            revision=revision,
        )
        self.revision = revision


class UsageMissing(LaneError):
    """The gated body finished but reported no token usage."""


class TiktokenUnavailable(InvalidInput):
    """tiktoken or its encoding is not available on this machine."""


class TraceError(LaneError, ValueError):
    """Bad traffic input for the simulator; the message names the field and the value."""

    exit_code = 2


class Replay(LaneError):
    """This (job, attempt) is already settled.

    Raised inside the ledger's settlement transaction to roll it back; the
    ledger answers the caller with the first settlement, never with this.
    """


class WatchdogTimeout(LaneError):
    """A lane gate's background machinery (the wake-up watcher or the lease renewer) did not answer within
    its watchdog's time: the task fails rather than wait for ever."""

"""The ledger's calls for provider limits: a 429's pause and the provider's own count (:class:`ProviderLimits`)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from ..checks import number, text, tokens
from ..errors import InvalidInput, UnknownJob, UnknownLane
from ..policy.limits import UNITS, Limit, LimitSyntaxError, limit_problem, parse_limit
from . import limits, queries, rates
from .db import Cursor

T = TypeVar("T")
# A provider's pause longer than this is taken for a mistake (a reset time read in the wrong unit).
MAX_PAUSE_SECONDS = 86_400.0


def check_limits(value: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Limit | None]:
    """``{unit: Limit | "500/60s" | None}`` or ``["requests=500/60s", "tokens=none"]`` as ``{unit: Limit | None}``.

    Raises:
        InvalidInput: naming the limit and the value.

    Example:
        >>> check_limits(["requests=500/60s", "output_tokens=none"])
        {'requests': Limit(amount=500, window_seconds=60.0), 'output_tokens': None}
    """
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (Mapping, list, tuple)):
        expected = 'expected ["UNIT=AMOUNT/WINDOW", ...] or {UNIT: "AMOUNT/WINDOW" | Limit | None}'
        raise InvalidInput("limits", value, expected)
    out: dict[str, Limit | None] = {}
    pairs = value.items() if isinstance(value, Mapping) else ((None, spec) for spec in value)
    for key, lim in pairs:
        spec = str(lim) if key is None else f"{key}={'none' if lim is None else lim}"
        try:
            if isinstance(lim, Limit):
                if key not in UNITS:
                    raise LimitSyntaxError(spec, f"unknown unit {key!r} (expected one of {', '.join(UNITS)})")
                why = limit_problem(lim)
                if why is not None:
                    raise LimitSyntaxError(spec, why)
                unit, parsed = key, lim
            else:
                unit, parsed = parse_limit(spec)
        except LimitSyntaxError as e:
            raise InvalidInput("limit", e.spec, e.why) from None
        if unit in out:
            raise InvalidInput("limit", spec, f"{unit} is limited twice: give each unit once")
        out[unit] = parsed
    return out


def split_rate_cost(rate_cost: Any, est: int, est_input: int | None) -> tuple[int | None, int | None, int | None]:
    """``(rate_cost, rate_input, rate_output)`` of a job for :meth:`Ledger.submit`.

    ``rate_cost`` an int (or None: ``est``) is split by ``est_input`` when known (the input tokens counted;
    the rest is the output allowance, as a learned estimate is input plus the stage's allowance); a dict
    ``{"input": I, "output": O}`` states the split (rate cost ``I + O``).

    Example:
        >>> split_rate_cost({"input": 600, "output": 300}, 900, None), split_rate_cost(None, 900, 700)
        ((900, 600, 300), (None, 700, 200))
    """
    if isinstance(rate_cost, Mapping):
        extra = set(rate_cost) - {"input", "output"}
        if extra or not {"input", "output"} <= set(rate_cost):
            raise InvalidInput("rate_cost", dict(rate_cost), 'expected {"input": TOKENS, "output": TOKENS}')
        i = tokens("rate_cost input", rate_cost["input"], low=0)
        o = tokens("rate_cost output", rate_cost["output"], low=0)
        if i + o < 1:
            raise InvalidInput("rate_cost", dict(rate_cost), "input + output must be at least 1")
        return i + o, i, o
    cost = None if rate_cost is None else tokens("rate_cost", rate_cost)
    base = est if cost is None else cost
    if est_input is not None and est_input <= base:
        return cost, est_input, base - est_input
    return cost, None, None


class ProviderLimits:
    """What the provider says about its limits, written through one :class:`~lane_plugin.Ledger` (its part,
    composed: the ledger's methods of the same names call these)."""

    def __init__(self, ledger: Any) -> None:  # the Ledger (api.py imports this module)
        self.led = ledger
        # (lane, until (time.time())) -> whether the ledger holds it: this process's memory of its pauses
        # (remember_pause). One key per pause, so each change is one dict operation on that pause's own key and
        # no lock is needed: a timeout raised into the thread at any bytecode leaves a pause remembered or not,
        # and never undoes another pause's entry.
        self.remembered: dict[tuple[str, float], bool] = {}

    def pause(self, lane: str, seconds: float, *, reason: str, job_id: str | None = None) -> float:
        lane = text("lane", lane)
        seconds = number("seconds", seconds, low=0.001, high=MAX_PAUSE_SECONDS)
        reason = text("reason", reason, limit=500)
        job_id = text("job id", job_id, required=False)
        here = self.remember_pause(lane, seconds)  # this process's gates stop at once, not after the write's lock wait

        def run(cur: Cursor, now: float) -> tuple[float, float]:
            return limits.pause(cur, lane, until=now + seconds, reason=reason, now=now, job_id=job_id), now

        try:
            until, now = self.led._run(run)
        except (UnknownLane, UnknownJob):  # nothing paused, in the ledger or in this process's memory
            self.remembered.pop((lane, here), None)
            raise
        self._written(lane, here)  # from now on the ledger's word on it wins (a reopen by any process ends it)
        wakeups = getattr(self.led, "wakeups", None)
        if wakeups is not None:  # this process's waiters tick the lane the moment it reopens
            wakeups.tick_at(lane, max(0.0, until - now))
        self.led._emit(
            "lane.paused",
            lane,
            {"lane": lane, "until": until, "seconds": round(until - now, 3), "reason": reason, "job_id": job_id},
        )
        return until

    def sent_now(self, job_id: str, attempt: int) -> None:
        job_id = text("job id", job_id)

        def run(cur: Cursor, now: float) -> None:
            rates.stamp_sent(cur, job_id, int(attempt), now, self.led.send_slack)

        self.led._run(run)

    def remember_pause(self, lane: str, seconds: float, *, written: bool = False) -> float:
        # a NaN would never end and never compare; more than a day is taken for a mistake, as pause() does
        seconds = min(number("seconds", seconds, low=0.0, high=1e12), MAX_PAUSE_SECONDS)
        self._forget_ended(lane)
        until = time.time() + seconds
        self.remembered[(lane, until)] = written
        return until

    def _written(self, lane: str, until: float) -> None:
        """The ledger holds a pause of ``lane`` until ``until`` or later: the pauses remembered here that end by
        then (the one just written, and one the send guard remembered before it) no longer outrank its word.
        One dict operation per pause."""
        for key in [
            k for k, written in list(self.remembered.items()) if k[0] == lane and k[1] <= until and not written
        ]:
            if key in self.remembered:  # (ended and dropped meanwhile: nothing to mark)
                self.remembered[key] = True

    def _live(self, lane: str) -> list[tuple[tuple[str, float], bool]]:
        """``lane``'s pauses remembered here that have not ended, with whether the ledger holds each."""
        now = time.time()
        return [(key, written) for key, written in list(self.remembered.items()) if key[0] == lane and key[1] > now]

    def paused_here(self, lane: str) -> float:
        ends = [key[1] for key, _ in self._live(lane)]
        return max(0.0, max(ends) - time.time()) if ends else 0.0

    def pauses_here(self, lane: str) -> frozenset[tuple[str, float]]:
        return frozenset(key for key, _ in self._live(lane))

    def paused_unheard(self, lane: str, known: frozenset[tuple[str, float]] | None = None) -> float:
        ends = [key[1] for key, written in self._live(lane) if not written or (known is not None and key not in known)]
        return max(0.0, max(ends) - time.time()) if ends else 0.0

    def _forget_ended(self, lane: str) -> None:
        """Drop ``lane``'s pauses remembered here that have ended: one pop per pause, of its own key."""
        now = time.time()
        for key in [k for k in list(self.remembered) if k[0] == lane and k[1] <= now]:
            self.remembered.pop(key, None)

    def pause_state(self, lane: str) -> tuple[float, float | None, float | None]:
        lane = text("lane", lane)

        def run(cur: Cursor, now: float) -> tuple[float, float | None, float | None]:
            r = cur.one(queries.LIMITS_PAUSE_STATE, {"l": lane})
            if r is None or r[0] is None:
                return 0.0, None, None
            until, probe = float(r[0]), r[1]
            if until > now:
                return until - now, None, None
            return 0.0, until, None if probe is None else float(probe) - now

        return self.led._run(run, write=False)

    def claim_probe(self, lane: str, ended: float, hold: float) -> float | None:
        lane = text("lane", lane)
        hold = number("hold", hold, low=0.001, high=MAX_PAUSE_SECONDS)

        def run(cur: Cursor, now: float) -> float | None:
            cur.execute(queries.LIMITS_PROBE_CLAIM, {"l": lane, "e": ended, "h": now + hold, "now": now})
            return now + hold if cur.rowcount == 1 else None

        return self.led._run(run)

    def reopen(self, lane: str, ended: float) -> bool:
        lane = text("lane", lane)

        def run(cur: Cursor, now: float) -> bool:
            cur.execute(queries.LIMITS_PROBE_REOPEN, {"l": lane, "e": ended})
            return cur.rowcount == 1

        done = self.led._run(run)
        self._forget_ended(lane)  # this process's memory of the pause that ended, too
        return done

    def give_back_probe(self, lane: str, ended: float, hold_until: float) -> None:
        lane = text("lane", lane)

        def run(cur: Cursor, now: float) -> None:
            cur.execute(queries.LIMITS_PROBE_GIVE_BACK, {"l": lane, "e": ended, "h": hold_until})

        self.led._run(run)

    def paused_for(self, lane: str) -> float:
        lane = text("lane", lane)
        if (left := self.paused_unheard(lane)) > 0:  # its write is out (or failed): the provider's word heard here
            return left
        known = self.pauses_here(lane)

        def run(cur: Cursor, now: float) -> float:
            until = cur.scalar(queries.LIMITS_PAUSED_UNTIL, {"l": lane})
            return 0.0 if until is None else max(0.0, float(until) - now)

        if (left := self.led._run(run, write=False)) > 0:  # still paused: the longer word, the ledger's or this one's
            return max(left, self.paused_here(lane))
        return self.paused_unheard(lane, known)  # open, unless a 429 was heard here while the read was out

    def provider_used(
        self, lane: str, used: Mapping[str, int], *, job_id: str | None = None, refused: bool = False
    ) -> None:
        lane = text("lane", lane)
        job_id = text("job id", job_id, required=False)
        clean = {}
        for unit, n in used.items():
            if unit not in UNITS:
                raise InvalidInput("unit", unit, f"expected one of {', '.join(UNITS)}")
            clean[unit] = tokens(f"{unit} used", n, low=0)

        def run(cur: Cursor, now: float) -> None:
            for unit, n in clean.items():
                limits.true_up_remaining(cur, lane, unit, n, now, job_id, refused)

        self.led._run(run)

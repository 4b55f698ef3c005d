"""What learned estimators read from and write to the ledger: samples and fitted state.

A learned estimator's state lives in table ``estimator_state`` (one row per
estimator and stage), so every process and machine that estimates with it
reads the same numbers. Its samples are settled jobs that recorded their input
tokens at intake (``job.est_input``) and were billed real usage (no
settlement of theirs has ``by_estimate``: an estimate billed back as the
actual would teach the estimator its own guess).
"""

from __future__ import annotations

import math
from typing import Any

from ..checks import label, text, tokens
from ..errors import InvalidInput
from . import queries
from .db import Cursor
from .queries import STATE_COLUMNS as STATE_COLUMNS

_FLOATS = ("mean", "m2", "mean_input", "p50", "p90", "p99")
MAX_WINDOW = 100_000


def output_samples(
    cur: Cursor, *, window: int, lane: str | None, stage: str | None
) -> dict[str, list[tuple[int, int]]]:
    """``{stage: [(est_input, actual), ...]}``: the newest ``window`` learnable jobs per stage, oldest first."""
    params: dict = {"w": window}
    if lane:
        params["lane"] = lane
    if stage:
        params["stage"] = stage
    rows = cur.all(queries.learning_output_samples(bool(lane), bool(stage)), params)
    out: dict[str, list[tuple[int, int]]] = {}
    for s, est_input, actual in rows:
        out.setdefault(s, []).append((int(est_input), int(actual)))
    return out


def read_state(cur: Cursor, estimator: str | None) -> list[dict]:
    """Fitted state rows, by estimator then stage (every estimator's when ``estimator`` is None)."""
    if estimator:
        rows = cur.all(queries.LEARNING_READ_STATE_OF, {"e": estimator})
    else:
        rows = cur.all(queries.LEARNING_READ_STATE, {})
    return [dict(zip(STATE_COLUMNS, r)) for r in rows]


def check_state_row(estimator: str, row: dict) -> dict:
    """A state row with every field checked (names the field and the value), ready to write."""
    if not isinstance(row, dict):
        raise InvalidInput("state row", row, "expected a mapping of the estimator_state columns")
    out = {"estimator": label("estimator", estimator)}
    out["stage"] = text("stage", row.get("stage"))
    out["revision"] = text("revision", row.get("revision"), limit=16)
    allowance = row.get("allowance")
    if isinstance(allowance, bool) or not isinstance(allowance, int) or abs(allowance) > 10**12:
        raise InvalidInput("allowance", allowance, "expected a whole number of tokens (may be negative)")
    out["allowance"] = allowance
    out["jobs"] = tokens("jobs", row.get("jobs", 0), low=0)
    for field in _FLOATS:
        value = row.get(field, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidInput(field, value, "expected a finite number")
        out[field] = float(value)
    if out["m2"] < 0:
        raise InvalidInput("m2", out["m2"], "a sum of squared deviations is never negative")
    return out


def write_state(cur: Cursor, rows: list[dict], now: float) -> None:
    """Insert or replace the rows (checked by :func:`check_state_row`), stamped ``fitted_at = now``."""
    cur.executemany(queries.LEARNING_WRITE_STATE, [dict(r, fitted_at=now) for r in rows])


class LearningStore:
    """What learned estimators read and write through one :class:`~lane_plugin.Ledger` (its part, composed: the
    ledger's methods of the same names call these)."""

    def __init__(self, ledger: Any) -> None:  # the Ledger (api.py imports this module)
        self.led = ledger

    def output_samples(
        self, *, window: int = 1000, lane: str | None = None, stage: str | None = None
    ) -> dict[str, list[tuple[int, int]]]:
        window = tokens("window", window)
        if window > MAX_WINDOW:
            raise InvalidInput("window", window, f"at most {MAX_WINDOW:,} jobs per stage")
        lane = text("lane", lane, required=False)
        stage = text("stage", stage, required=False)
        return self.led._run(lambda cur, now: output_samples(cur, window=window, lane=lane, stage=stage), write=False)

    def estimator_state(self, estimator: str | None = None) -> list[dict]:
        estimator = None if estimator is None else label("estimator", estimator)
        return self.led._run(lambda cur, now: read_state(cur, estimator), write=False)

    def save_estimator_state(self, estimator: str, rows: list[dict]) -> None:
        checked = [check_state_row(estimator, r) for r in rows]
        if checked:
            self.led._run(lambda cur, now: write_state(cur, checked, now))

"""Trace files for ``lane simulate``: four CSV formats, told apart by their header.

================  =============================================  ======================================
format            columns (extra columns are ignored)            where it comes from
================  =============================================  ======================================
``est``           ``arrival_s,stage,est,actual`` + optional      ``write_csv``, your own tooling
                  ``run_key,rate_cost,input_tokens,output_tokens``
``tokens``        ``arrival_s,input_tokens,output_tokens`` +     a log of real calls
                  optional ``stage,run_key,est,rate_cost``
``azure``         ``TIMESTAMP,ContextTokens,GeneratedTokens``    Azure LLM inference traces (2023)
``mooncake``      ``timestamp_ms,input_length,output_length``    Mooncake traces (FAST'25)
================  =============================================  ======================================

What the lane is told about a real call (``tokens``, ``azure``, ``mooncake``):
the input (the prompt) is known before the call, the output is not. So, with
``output_allowance`` (default 256) and the client's ``max_tokens`` (default
2048), unless the row gives ``est`` / ``rate_cost`` itself:

- ``est = input + min(output_allowance, max_tokens)``: what the budget is
  charged at admission, settled to the real bill;
- ``rate_cost = input + max_tokens``: what a provider counting prompt +
  max_tokens (as OpenAI's TPM does) charges at request time;
- ``output = min(output, max_tokens)`` (the provider stops there) and
  ``actual = input + output``; the worker's time follows ``output``.

Arrivals are seconds from the first row (``azure``: its time stamps read as
UTC; ``mooncake``: milliseconds / 1000). Rows without ``run_key`` are single
calls (no run). Every error names the file, the line and the field.
"""

from __future__ import annotations

import csv
import math
from datetime import datetime, timezone
from pathlib import Path

from ..errors import TraceError
from .traffic import Trace

OUTPUT_ALLOWANCE = 256
MAX_TOKENS = 2_048
FORMATS = {
    "est": ("arrival_s", "stage", "est", "actual"),
    "tokens": ("arrival_s", "input_tokens", "output_tokens"),
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "mooncake": ("timestamp_ms", "input_length", "output_length"),
}


class _Rows:
    """The rows of one CSV file, with checked fields that name file, line and field."""

    def __init__(self, path: str | Path, fh) -> None:
        self.path = path
        self.reader = csv.DictReader(fh)
        self.cols = [c.strip() for c in (self.reader.fieldnames or [])]
        self.reader.fieldnames = self.cols
        self.line = 1
        self.row: dict = {}

    def __iter__(self):
        for line, row in enumerate(self.reader, start=2):
            self.line, self.row = line, row
            yield self

    def fail(self, name: str, raw, why: str) -> TraceError:
        return TraceError(f"{self.path}, line {self.line}: {name}={raw!r} {why}")

    def raw(self, name: str) -> str:
        return (self.row.get(name) or "").strip()

    def number(self, name: str, *, integer: bool = False, optional: bool = False, minimum: float = 0):
        raw = self.raw(name)
        if optional and raw == "":
            return None
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(name, raw, "is not a number") from None
        if not math.isfinite(value) or value < minimum:
            raise self.fail(name, raw, f"must be a finite number >= {minimum:g}")
        if integer:
            if value != int(value):
                raise self.fail(name, raw, "must be a whole number of tokens")
            return int(value)
        return value

    def tokens(self, name: str, *, optional: bool = False, minimum: int = 0) -> int | None:
        return self.number(name, integer=True, optional=optional, minimum=minimum)


def detect(cols: list[str]) -> str | None:
    """The format whose required columns are all in the header (``est`` first), or None."""
    for name, required in FORMATS.items():
        if all(c in cols for c in required):
            return name
    return None


def _header_error(path, cols: list[str]) -> TraceError:
    """Name the columns missing for the format the header comes closest to, or list the formats."""
    have = ", ".join(cols) or "none"
    near = max(FORMATS, key=lambda k: sum(c in cols for c in FORMATS[k]))
    if any(c in cols for c in FORMATS[near]):
        missing = ", ".join(c for c in FORMATS[near] if c not in cols)
        return TraceError(f"{path}: missing column(s) {missing} of the {near!r} trace format (have: {have})")
    wanted = "; ".join(f"{k}: {','.join(v)}" for k, v in FORMATS.items())
    return TraceError(f"{path}: unknown trace header (have: {have}); expected the columns of one of: {wanted}")


def _timestamp(rows: _Rows, name: str) -> float:
    """Seconds since the epoch of ``2023-11-16 18:17:03.9799600`` (UTC; any number of fraction digits)."""
    raw = rows.raw(name)
    whole, _, frac = raw.partition(".")
    try:
        base = datetime.fromisoformat(whole)
        fraction = float("0." + frac) if frac else 0.0
    except ValueError:
        raise rows.fail(name, raw, "is not a date-time (YYYY-MM-DD HH:MM:SS[.fraction])") from None
    if base.tzinfo is None:
        base = base.replace(tzinfo=timezone.utc)
    return base.timestamp() + fraction


def load_trace(path: str | Path, *, output_allowance: int = OUTPUT_ALLOWANCE, max_tokens: int = MAX_TOKENS) -> Trace:
    """Read any of the four trace formats (see the module docstring).

    Args:
        path: the CSV file.
        output_allowance: tokens of output the estimate allows for (real-call formats).
        max_tokens: the client's cap on output tokens (real-call formats).

    Raises:
        TraceError: an unknown header, a missing column or a bad value, naming
            the file, the line and the field.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "m.csv")
        >>> _ = open(p, "w").write("timestamp_ms,input_length,output_length\\n0,1000,300\\n1500,200,40\\n")
        >>> tr = load_trace(p, output_allowance=100, max_tokens=500)
        >>> tr.arrival, tr.est, tr.rate_cost, tr.actual, tr.output_tokens
        ([0.0, 1.5], [1100, 300], [1500, 700], [1300, 240], [300, 40])
    """
    if output_allowance < 0:
        raise TraceError(f"output_allowance={output_allowance!r} must be >= 0")
    if max_tokens <= 0:
        raise TraceError(f"max_tokens={max_tokens!r} must be > 0")
    try:
        fh = open(path, newline="", encoding="utf-8-sig")  # a spreadsheet's CSV starts with a byte-order mark
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    with fh:
        try:
            rows = _Rows(path, fh)
            fmt = detect(rows.cols)
            if fmt is None:
                raise _header_error(path, rows.cols)
            trace = _read_est(rows) if fmt == "est" else _read_calls(rows, fmt, output_allowance, max_tokens)
        except UnicodeDecodeError as exc:
            raise TraceError(f"{path}: not UTF-8 text ({exc.reason}; a compressed or binary file?)") from None
    if not len(trace):
        raise TraceError(f"{path}: no jobs in the trace")
    return trace.sort()


def load_csv(path: str | Path) -> Trace:
    """Read a trace CSV with header ``arrival_s,stage,est,actual[,run_key]`` (any format, in fact).

    Kept for callers of the first format; :func:`load_trace` reads all four.
    """
    return load_trace(path)


def _read_est(rows: _Rows) -> Trace:
    trace = Trace(source=f"trace {rows.path}")
    for r in rows:
        trace.add(
            r.number("arrival_s"),
            r.raw("stage") or "default",
            r.tokens("est", minimum=1),
            r.tokens("actual"),
            r.raw("run_key") or None,
            rate_cost=r.tokens("rate_cost", optional=True, minimum=1),
            input_tokens=r.tokens("input_tokens", optional=True),
            output_tokens=r.tokens("output_tokens", optional=True),
            tenant=r.raw("tenant") or None,
        )
    return trace


def _read_calls(rows: _Rows, fmt: str, output_allowance: int, max_tokens: int) -> Trace:
    allow = min(output_allowance, max_tokens)
    names = {
        "tokens": ("arrival_s", "input_tokens", "output_tokens"),
        "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        "mooncake": ("timestamp_ms", "input_length", "output_length"),
    }[fmt]
    label = {"tokens": "trace", "azure": "Azure trace", "mooncake": "Mooncake trace"}[fmt]
    trace = Trace(
        source=f"{label} {Path(rows.path).name} (est = input + {allow}, rate_cost = input + {max_tokens} max_tokens)"
    )
    stamps: list[float] = []
    for r in rows:
        t_name, in_name, out_name = names
        if fmt == "azure":
            t = _timestamp(r, t_name)
        elif fmt == "mooncake":
            t = r.number(t_name) / 1000.0
        else:
            t = r.number(t_name)
        inp = r.tokens(in_name)
        out = min(r.tokens(out_name), max_tokens)
        est = r.tokens("est", optional=True, minimum=1) if fmt == "tokens" else None
        rate = r.tokens("rate_cost", optional=True, minimum=1) if fmt == "tokens" else None
        if est is None:
            est = inp + allow
            if est <= 0:
                raise r.fail(in_name, r.raw(in_name), f"gives est = input + {allow} = 0; an estimate must be > 0")
        stamps.append(t)
        trace.add(
            t,
            (r.raw("stage") if fmt == "tokens" else "") or "call",
            est,
            inp + out,
            (r.raw("run_key") or None) if fmt == "tokens" else None,
            rate_cost=rate if rate is not None else inp + max_tokens,
            input_tokens=inp,
            output_tokens=out,
            tenant=(r.raw("tenant") or None) if fmt == "tokens" else None,
        )
    if fmt in ("azure", "mooncake") and stamps:
        t0 = min(stamps)
        trace.arrival = [t - t0 for t in trace.arrival]
    return trace


def write_csv(trace: Trace, path: str | Path) -> None:
    """Write a trace in the ``est`` format (every column it has), which :func:`load_trace` reads back."""
    extra = [
        c
        for c in ("rate_cost", "input_tokens", "output_tokens", "tenant")
        if any(v is not None for v in getattr(trace, c))
    ]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["arrival_s", "stage", "est", "actual", "run_key", *extra])
        for i in range(len(trace)):
            more = ["" if getattr(trace, c)[i] is None else getattr(trace, c)[i] for c in extra]
            w.writerow(
                [
                    f"{trace.arrival[i]:.3f}",
                    trace.stage[i],
                    trace.est[i],
                    trace.actual[i],
                    trace.run_key[i] or "",
                    *more,
                ]
            )


__all__ = ["FORMATS", "MAX_TOKENS", "OUTPUT_ALLOWANCE", "detect", "load_csv", "load_trace", "write_csv"]

"""What a ``lane`` command prints on stderr: first the ledger it reads, then (on an error) one line."""

from __future__ import annotations

LEDGER_LINE = "lane: ledger "


def error_lines(stderr: str) -> list[str]:
    """``stderr``'s lines after the one naming the ledger (every command that reads a ledger says which first)."""
    lines = stderr.strip().splitlines()
    return lines[1:] if lines and lines[0].startswith(LEDGER_LINE) else lines

"""What every ``lane`` command shares: the ledger it reads (named first, on stderr), ``--json`` and tables.

Every command that reads a ledger says which before anything else, in one short line on stderr,
with the password masked and where the URL came from::

    lane: ledger sqlite:////home/me/.prefect/lane.db (the default: no --db, LANE_DATABASE_URL unset)
    lane: ledger postgresql+psycopg://lane:***@db.internal:5432/lane (from LANE_DATABASE_URL)

so two shells that read two ledgers (one without ``LANE_DATABASE_URL``) cannot be mistaken for one.
Tables fit 100 characters (or a narrower terminal); ``--wide`` shows every column. Imports neither
Prefect nor pandas (``submit``, ``tick`` and ``settle`` stay fast).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
from collections.abc import Collection, Sequence

import typer

from .cli_text import as_blocks, for_json
from .tables import WIDTH, fit, line_width

# Plain click help (no rich boxes): switches show no <bool>, and it reads the same piped or not.
PLAIN = dict(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=False)
JSON = typer.Option(False, "--json", help="Print JSON for scripts (times in ISO-8601 UTC).")
WIDE = typer.Option(False, "--wide", help=f"Show every column, however wide (by default tables fit {WIDTH}).")
state: dict = {"db": None}  # the root --db (lane moves it to the front from anywhere)
DEFAULT_SOURCE = "the default: no --db, LANE_DATABASE_URL unset"


def ledger_source(db: str | None) -> str:
    """Where the ledger URL comes from, in words: ``from --db``, ``from LANE_DATABASE_URL`` or the default."""
    from .ledger.url import ENV_VAR, block_ref
    from .settings import database_url

    given, source = (db, "--db") if db is not None else (database_url(), ENV_VAR)
    if given is None:
        return DEFAULT_SOURCE
    block = block_ref(given)
    return f"block lane-ledger/{block}, from {source}" if block else f"from {source}"


def name_ledger(db: str | None) -> str:
    """The URL of the ledger ``db`` (or the environment) names, said first on stderr; blocks are loaded.

    Example::

        lane: ledger sqlite:////tmp/demo.db (from --db)
    """
    from .ledger.url import parse_url, resolve_url

    source = ledger_source(db)
    raw = resolve_url(db)
    typer.echo(f"lane: ledger {parse_url(raw).display} ({source})", err=True)
    return raw


def ledger(create: bool = True, db: str | None = None):
    """The ledger named by ``--db`` (or ``db``), named on stderr; ``create=False`` for read-only commands
    (a missing ledger is exit 3)."""
    from .ledger import Ledger

    return Ledger(name_ledger(state["db"] if db is None else db), create=create)


def print_json(data) -> None:
    typer.echo(json.dumps(for_json(data), indent=2, default=str, ensure_ascii=False))


def echo_wrapped(lines: Sequence[str], width: int = WIDTH) -> None:
    """Print prose lines wrapped at ``width`` between words, each continuation indented two more than its line."""
    for line in lines:
        indent = line[: len(line) - len(line.lstrip())]
        wrapped = textwrap.wrap(
            line.strip(),
            width=width,
            initial_indent=indent,
            subsequent_indent=indent + "  ",
            break_long_words=False,
            break_on_hyphens=False,
        )
        typer.echo("\n".join(wrapped) if wrapped else line)


def table_width() -> int:
    """The width tables fit: 100, or the terminal's when it is narrower (piped: 100)."""
    if not sys.stdout.isatty():
        return WIDTH
    return min(WIDTH, shutil.get_terminal_size((WIDTH, 24)).columns)


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    wide: bool = False,
    right: Collection[str] = (),
    optional: Sequence[str] = (),
    below: str | None = None,
) -> None:
    """A titled table that fits :func:`table_width` (``wide``: every column); see :func:`lane_plugin.tables.fit`.

    A terminal too narrow even for the columns that are never left out gets one block per row instead:
    its first cell, then ``column value`` pairs, no number folded.
    """
    width = table_width()
    cells = [["" if v is None else str(v) for v in r] for r in rows]
    needed = [c for c in columns if c not in optional and c != below]
    if not wide and cells and line_width(needed, [[r[columns.index(c)] for c in needed] for r in cells]) > width:
        typer.echo("\n".join(as_blocks(title, list(columns), cells, width)))
        return
    typer.echo(
        "\n".join([title, *fit(columns, cells, width=width, wide=wide, right=right, optional=optional, below=below)])
    )


__all__ = [
    "JSON",
    "PLAIN",
    "WIDE",
    "echo_wrapped",
    "ledger",
    "ledger_source",
    "name_ledger",
    "print_json",
    "print_table",
    "state",
]

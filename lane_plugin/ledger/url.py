"""Where the ledger lives: ``--db``, ``LANE_DATABASE_URL``, or ``lane.db`` under PREFECT_HOME.

One resolution for every entry point (the CLI, the gate, the scheduled flows):
an explicit URL, else ``LANE_DATABASE_URL`` (:mod:`lane_plugin.settings`), else
:func:`default_url`. Any of them may name a Prefect block instead of a URL
(``block:lane-ledger/prod``, or ``lane-ledger/prod``), loaded through the
Prefect API by :mod:`lane_plugin.blocks`.

Parsed without SQLAlchemy so that the CLI starts fast. Passwords never leave
this module unmasked: use :func:`redact` on anything that may be shown.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from ..errors import InvalidInput

ENV_VAR = "LANE_DATABASE_URL"
BLOCK_SLUG = "lane-ledger"
_BLOCK = re.compile(r"^block:(?:lane-ledger/)?(?P<name>[\w][\w.-]*)$|^lane-ledger/(?P<bare>[\w][\w.-]*)$")
# Greedy up to the last "@" before the path: a password may itself contain "@".
_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^/\s]*(@)")
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&\s]*", re.IGNORECASE)


def redact(text: str) -> str:
    """Mask the password of any database URL inside ``text`` (in the userinfo or a ?password=)."""
    return _QUERY_PASSWORD.sub(r"\1***", _PASSWORD.sub(r"\1***\2", str(text)))


def default_url() -> str:
    home = os.environ.get("PREFECT_HOME") or str(Path.home() / ".prefect")
    return f"sqlite:///{Path(home).expanduser() / 'lane.db'}"


def block_ref(value) -> str | None:
    """The block name in ``block:NAME``, ``block:lane-ledger/NAME`` or ``lane-ledger/NAME``; else None.

    Example:
        >>> block_ref("block:prod"), block_ref("lane-ledger/prod"), block_ref("sqlite:///x.db")
        ('prod', 'prod', None)
    """
    if not isinstance(value, str) or "://" in value:
        return None
    m = _BLOCK.match(value.strip())
    if m is None:
        if value.strip().startswith("block:"):
            raise InvalidInput("ledger block", value, f"expected block:NAME or block:{BLOCK_SLUG}/NAME")
        return None
    return m.group("name") or m.group("bare")


def resolve_url(url: str | None = None) -> str:
    """The ledger URL to use: ``url``, else ``LANE_DATABASE_URL``, else :func:`default_url`; blocks loaded."""
    from ..settings import database_url

    raw = url or database_url() or default_url()
    name = block_ref(raw)
    if name is None:
        return raw
    from ..blocks import load_url  # imports Prefect: only for a block reference

    return load_url(name)


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed ledger URL: ``sqlite:///path`` or ``postgresql[+psycopg]://...``."""

    raw: str
    dialect: str  # "sqlite" | "postgresql"
    path: str | None = None  # sqlite file
    conninfo: dict | None = None  # psycopg keyword arguments

    def __str__(self) -> str:
        return redact(self.raw)

    @property
    def sqlalchemy_url(self) -> str:
        if self.dialect == "sqlite":
            return f"sqlite:///{self.path}"
        return re.sub(r"^postgres(ql)?(\+\w+)?://", "postgresql+psycopg://", self.raw)


def parse_url(url: str | None = None) -> DatabaseURL:
    """Parse a ledger URL, raising :class:`InvalidInput` naming the (redacted) URL."""
    raw = resolve_url(url)
    if isinstance(raw, str) and "\x00" in raw:
        raise InvalidInput("database URL", redact(raw), "contains a NUL character")
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidInput("database URL", raw, "expected sqlite:///PATH or postgresql+psycopg://...")
    scheme, sep, rest = raw.partition("://")
    base = scheme.split("+", 1)[0].lower()
    shown = redact(raw)
    if not sep:
        raise InvalidInput("database URL", shown, "expected sqlite:///PATH or postgresql+psycopg://...")
    if base == "sqlite":
        driver = scheme.partition("+")[2]
        if driver not in ("", "pysqlite"):
            raise InvalidInput("database URL", shown, f"unsupported SQLite driver {driver!r}")
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            raise InvalidInput("database URL", shown, "a ledger needs a file: sqlite:///relative.db or sqlite:////abs.db")
        path = rest[1:].split("?", 1)[0]
        return DatabaseURL(raw, "sqlite", path=str(Path(path).expanduser()))
    if base in ("postgresql", "postgres"):
        driver = scheme.partition("+")[2]
        if driver not in ("", "psycopg"):
            raise InvalidInput("database URL", shown, f"unsupported PostgreSQL driver {driver!r}; use postgresql+psycopg://")
        try:
            parts = urlsplit("postgresql://" + rest)
            port = parts.port
        except ValueError as exc:
            raise InvalidInput("database URL", shown, str(exc)) from None
        info: dict = {}
        if parts.hostname:
            info["host"] = parts.hostname
        if port:
            info["port"] = port
        if parts.username:
            info["user"] = unquote(parts.username)
        if parts.password:
            info["password"] = unquote(parts.password)
        dbname = parts.path.lstrip("/")
        if not dbname:
            raise InvalidInput("database URL", shown, "no database name")
        info["dbname"] = unquote(dbname)
        for item in filter(None, parts.query.split("&")):
            k, _, v = item.partition("=")
            info[k] = unquote(v)
        return DatabaseURL(raw, "postgresql", conninfo=info)
    raise InvalidInput("database URL", shown, f"unsupported scheme {scheme!r}; expected sqlite or postgresql+psycopg")

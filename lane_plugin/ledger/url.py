"""Where the ledger lives: ``--db``, ``LANE_DATABASE_URL``, or ``lane.db`` under PREFECT_HOME.

One resolution for every entry point (the CLI, the gate, the scheduled flows):
an explicit URL, else ``LANE_DATABASE_URL`` (:mod:`lane_plugin.settings`), else
:func:`default_url`. Any of them may name a Prefect block instead of a URL
(``block:lane-ledger/prod``, or ``lane-ledger/prod``), loaded through the
Prefect API by :mod:`lane_plugin.blocks`.

One parser (:func:`parse_url`, without SQLAlchemy so that the CLI starts fast):
the ledger's connections and its Alembic migrations both use the parts it
found (:attr:`DatabaseURL.conninfo`, :attr:`DatabaseURL.sqlalchemy_url`), never
a second reading of the string. User, password, database name, SQLite path and
query values are percent-decoded; a raw ``@``, ``#``, space or tab in a password
is accepted, a raw ``/`` or ``?`` is refused (percent-encode it).

One redaction: a URL is shown as SQLAlchemy renders it with the password hidden,
and query-string secrets (``password``, ``sslpassword``) masked too
(``str(DatabaseURL)``). :func:`redact` is the safety net for free text (a
driver's message, a CLI error): it masks every password this process has parsed
and anything that looks like one in a URL.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

from ..errors import DatabaseError, InvalidInput
from ..redaction import MASK, SECRET_PARAMS, redact, remember

ENV_VAR = "LANE_DATABASE_URL"
BLOCK_SLUG = "lane-ledger"
_BLOCK = re.compile(r"^block:(?:lane-ledger/)?(?P<name>[\w][\w.-]*)$|^lane-ledger/(?P<bare>[\w][\w.-]*)$")


def mask_raw(raw: str) -> str:
    """A URL that may not parse, shown without its password: all between ``user:`` and the last ``@`` is masked."""
    scheme, sep, rest = str(raw).partition("://")
    if sep and "@" in rest:
        userinfo, _, after = rest.rpartition("@")
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:{MASK}@{after}" if ":" in userinfo else f"{userinfo}@{after}"
    return redact(scheme + sep + rest)


def default_url() -> str:
    home = os.environ.get("PREFECT_HOME") or str(Path.home() / ".prefect")
    path = str(Path(home).expanduser() / "lane.db")
    # the parser decodes %XX and ends the path at '?': a home holding either is written so it reads back as itself
    return "sqlite:///" + path.replace("%", "%25").replace("?", "%3F")


def make_default_home(url: DatabaseURL) -> None:
    """Create the missing directory of a SQLite ledger at the default location (a fresh machine has no
    ``~/.prefect``); any other missing directory is a typo far more often than a wish: refused, nothing made."""
    path = Path(url.path or "")
    if str(path) != parse_url(default_url()).path:
        raise DatabaseError(f"cannot open {url}: no directory {path.parent} (create it first, or check the path)")
    path.parent.mkdir(parents=True, exist_ok=True)


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

    if isinstance(url, str) and not url.strip():  # `--db ""` (an unset shell variable): never the default ledger
        raise InvalidInput("database URL", url, "is empty: " + _URL_HELP)
    raw = url or database_url() or default_url()
    name = block_ref(raw)
    if name is None:
        return raw
    from ..blocks import load_url  # imports Prefect: only for a block reference

    return load_url(name)


@dataclass(frozen=True)
class DatabaseURL:
    """A parsed ledger URL: ``sqlite:///path`` or ``postgresql[+psycopg]://...``.

    ``str()`` and ``repr()`` never show a password; ``raw`` is the string as given.
    """

    raw: str = field(repr=False)
    dialect: str  # "sqlite" | "postgresql"
    path: str | None = None  # sqlite file
    conninfo: dict | None = field(default=None, repr=False)  # psycopg keyword arguments

    def __str__(self) -> str:
        return self.sqlalchemy_url_shown

    def __repr__(self) -> str:
        return f"DatabaseURL({str(self)!r})"

    def _url(self, hide: bool):
        from sqlalchemy.engine import URL

        if self.dialect == "sqlite":
            return URL.create("sqlite", database=self.path)
        info = dict(self.conninfo or {})
        named = {k: info.pop(k, None) for k in ("host", "port", "user", "password", "dbname")}
        query = {k: (MASK if hide and k.lower() in SECRET_PARAMS else v) for k, v in info.items()}
        return URL.create(
            "postgresql+psycopg",
            username=named["user"],
            password=named["password"],
            host=named["host"],
            port=named["port"],
            database=named["dbname"],
            query=query,
        )

    @property
    def sqlalchemy_url(self):
        """The same parts as a SQLAlchemy ``URL`` object (what the migrations connect with); never re-parsed."""
        return self._url(hide=False)

    @property
    def sqlalchemy_url_shown(self) -> str:
        """SQLAlchemy's rendering with the password hidden and query-string secrets masked."""
        return self._url(hide=True).render_as_string(hide_password=True).replace(quote(MASK), MASK)

    @property
    def display(self) -> str:
        """The URL as the ``lane`` command names its ledger, without loading SQLAlchemy: a SQLite file by its
        absolute path, a server's URL with its password (and query-string secrets) masked.

        Example:
            >>> parse_url("postgresql+psycopg://lane:s3cret@db:5432/lane").display
            'postgresql+psycopg://lane:***@db:5432/lane'
        """
        if self.dialect == "sqlite":
            return "sqlite:///" + os.path.abspath(self.path or "")
        info = dict(self.conninfo or {})  # from the parsed parts: the raw string may hold '@' in a query secret
        user, password, host, port, dbname = (info.pop(k, None) for k in ("user", "password", "host", "port", "dbname"))
        auth = "" if user is None and password is None else quote(user or "", safe="")
        auth += f":{MASK}@" if password is not None else ("@" if auth else "")
        if host and host.startswith("/"):  # a Unix socket directory: a query parameter, as libpq reads it
            info, host = {"host": host, **info}, None
        host = f"[{host}]" if host and ":" in host else (host or "")
        query = "&".join(
            f"{quote(k, safe='')}={MASK if k.lower() in SECRET_PARAMS else quote(str(v), safe='')}"
            for k, v in info.items()
        )
        url = f"postgresql+psycopg://{auth}{host}{f':{port}' if port else ''}/{quote(dbname or '', safe='')}"
        return redact(url + (f"?{query}" if query else ""))

    def scrub(self, text) -> str:
        """``text`` with this URL's secrets masked wherever they appear (a driver's message, say)."""
        out = str(text).replace(self.raw, str(self)) if self.raw else str(text)
        for key, value in (self.conninfo or {}).items():
            if key == "password" or key.lower() in SECRET_PARAMS:
                for form in sorted({value, quote(value, safe=""), quote(value)}, key=len, reverse=True):
                    if len(form) >= 4:  # a shorter one is masked in the URL itself, not hunted in prose
                        out = out.replace(form, MASK)
        return redact(out)


_URL_HELP = "expected sqlite:///PATH or postgresql+psycopg://..."


_ENCODE = "the user name or password holds a '/' or '?': percent-encode it (%2F, %3F)"


def _hostport(hostport: str, shown: str, later_at: bool) -> tuple[str | None, int | None]:
    if hostport.startswith("["):
        host, closed, tail = hostport[1:].partition("]")
        if not closed:
            raise InvalidInput("database URL", shown, "unclosed '[' in the host")
        if tail and not tail.startswith(":"):
            raise InvalidInput("database URL", shown, "unexpected text after the IPv6 host")
        port = tail[1:]
    else:
        host, _, port = hostport.partition(":")
    if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        # after a "/" or "?" in a password, the "port" is a piece of the password: never show it
        raise InvalidInput("database URL", shown, _ENCODE if later_at else "the port is not a number 1-65535")
    return (unquote(host) or None), (int(port) if port else None)


def _parse_pg(rest: str, shown: str) -> dict:
    end = len(rest)
    for ch in "/?":
        at = rest.find(ch)
        if at != -1:
            end = min(end, at)
    authority, tail = rest[:end], rest[end:]
    userinfo, at_sign, hostport = authority.rpartition("@")
    if not at_sign and "@" in tail.partition("?")[0]:  # "u:p/w@host/db": the path is not "w@host/db"
        raise InvalidInput("database URL", shown, _ENCODE)
    info: dict = {}
    host, port = _hostport(hostport, shown, "@" in tail)
    if host:
        info["host"] = host
    if port:
        info["port"] = port
    if at_sign:
        user, colon, password = userinfo.partition(":")
        if user:
            info["user"] = unquote(user)
        if colon:
            info["password"] = unquote(password)
            remember(password, info["password"])
    path, _, query = tail.partition("?")
    dbname = unquote(path.lstrip("/"))
    if not dbname:
        raise InvalidInput("database URL", shown, "no database name")
    info["dbname"] = dbname
    for item in filter(None, query.split("&")):
        k, _, v = item.partition("=")
        info[unquote(k)] = unquote(v)
        if unquote(k).lower() in SECRET_PARAMS:
            remember(v, unquote(v))
    return info


def parse_url(url: str | None = None) -> DatabaseURL:
    """Parse a ledger URL, raising :class:`InvalidInput` naming the URL (its password masked)."""
    raw = resolve_url(url)
    if isinstance(raw, str) and "\x00" in raw:
        raise InvalidInput("database URL", mask_raw(raw), "contains a NUL character")
    if not isinstance(raw, str) or not raw.strip():
        raise InvalidInput("database URL", raw, _URL_HELP)
    try:  # a non-UTF-8 byte on a command line arrives as a lone surrogate: no driver nor URL renderer takes it
        raw.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput("database URL", mask_raw(raw), "is not valid unicode text") from None
    scheme, sep, rest = raw.partition("://")
    base = scheme.split("+", 1)[0].lower()
    shown = mask_raw(raw)
    if not sep:
        raise InvalidInput("database URL", shown, _URL_HELP)
    if base == "sqlite":
        driver = scheme.partition("+")[2]
        if driver not in ("", "pysqlite"):
            raise InvalidInput("database URL", shown, f"unsupported SQLite driver {driver!r}")
        if not rest.startswith("/") or rest in ("/", "/:memory:"):
            raise InvalidInput(
                "database URL", shown, "a ledger needs a file: sqlite:///relative.db or sqlite:////abs.db"
            )
        path = unquote(rest[1:].split("?", 1)[0])
        if "\x00" in path:
            raise InvalidInput("database URL", shown, "contains a NUL character")
        try:
            return DatabaseURL(raw, "sqlite", path=str(Path(path).expanduser()))
        except RuntimeError:  # ~name of no such user
            raise InvalidInput("database URL", shown, f"{path.split('/')[0]!r}: no such user's home") from None
    if base in ("postgresql", "postgres"):
        driver = scheme.partition("+")[2]
        if driver not in ("", "psycopg"):
            raise InvalidInput(
                "database URL", shown, f"unsupported PostgreSQL driver {driver!r}; use postgresql+psycopg://"
            )
        return DatabaseURL(raw, "postgresql", conninfo=_parse_pg(rest, shown))
    raise InvalidInput("database URL", shown, f"unsupported scheme {scheme!r}; expected sqlite or postgresql+psycopg")

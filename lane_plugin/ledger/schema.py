"""Schema management with the Alembic migrations shipped in this package.

``lane db upgrade`` runs :func:`upgrade`; a fresh embedded ledger runs it on
first use. Concurrent first uses are serialised (a file lock on SQLite, an
advisory lock on PostgreSQL) so many processes may start at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..errors import UnknownRevision

MIGRATIONS = Path(__file__).with_name("migrations")
# Bump together with a new file in lane_plugin/ledger/migrations/versions.
HEAD_REVISION = "0013"
_PG_LOCK_ID = 0x1A4E_0001


def alembic_config(connection):
    """Alembic's configuration, handed an open connection: Alembic never parses a URL string of ours."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["connection"] = connection
    return cfg


def known_revisions() -> list[str]:
    """Every revision the shipped migrations know, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(MIGRATIONS))
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def check_revision(db, revision: str | None) -> None:
    """Raise :class:`UnknownRevision` when ``revision`` is not one of ours (never hand Alembic an unknown one)."""
    if revision is None or revision == HEAD_REVISION:
        return
    known = known_revisions()
    if revision not in known:
        raise UnknownRevision(str(db.url), revision, known)


def migration_lock_path(ledger_path: str) -> Path:
    """The lock file that serialises first uses of one SQLite ledger.

    It lives in the temporary directory, named by the ledger's absolute path, so
    nothing is left beside the ledger (never unlinked: a waiter may hold it open).
    """
    digest = hashlib.sha256(os.path.realpath(ledger_path).encode()).hexdigest()[:24]
    return Path(tempfile.gettempdir()) / f"lane-ledger-{digest}.migrate.lock"


@contextmanager
def _migration_lock(db):
    if db.dialect == "sqlite":
        with open(migration_lock_path(db.url.path), "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)
        return
    conn = db.connection()
    conn.execute("select pg_advisory_lock(%s)", (_PG_LOCK_ID,))
    try:
        yield
    finally:
        conn.execute("select pg_advisory_unlock(%s)", (_PG_LOCK_ID,))


def upgrade(db, revision: str = "head") -> str | None:
    """Bring the ledger's schema to ``revision``; returns the revision it is at."""
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    with _migration_lock(db):
        check_revision(db, db.revision())  # under the lock: what Alembic is about to read
        # The parts lane_plugin.ledger.url parsed (the same ones every connection uses), as a URL object.
        engine = create_engine(db.url.sqlalchemy_url, poolclass=NullPool)
        try:
            with engine.begin() as conn:
                command.upgrade(alembic_config(conn), revision)
        finally:
            engine.dispose()
    return db.revision()

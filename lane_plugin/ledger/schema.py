"""Schema management with the Alembic migrations shipped in this package.

``lane db upgrade`` runs :func:`upgrade`; a fresh embedded ledger runs it on
first use. Concurrent first uses are serialised (a file lock beside the ledger on
SQLite, removed once the migration is done; an advisory lock on PostgreSQL) so
many processes may start at once.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import UnknownRevision
from . import queries

MIGRATIONS = Path(__file__).with_name("migrations")
# Bump together with a new file in lane_plugin/ledger/migrations/versions.
HEAD_REVISION = "0021"
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
    """The lock file that serialises the migrations of one SQLite ledger: ``LEDGER.migrate.lock`` beside it.

    Beside the ledger's real path (a symlink to it shares the lock): the migration writes that directory
    anyway, and nothing is left in the system temporary directory. It exists only while a process
    migrates the ledger or waits to (:func:`file_lock` removes it), or after one was killed mid-migration
    (the next migration takes it over and removes it).
    """
    return Path(os.path.realpath(ledger_path) + ".migrate.lock")


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing), and remove the file before letting go.

    Removing a lock file is safe only with this check: a waiter may have opened the file the holder
    removes, and a newcomer then creates a new one and locks it at once. So, once it has the lock, a
    process checks that ``path`` still names the file it locked; if not, it opens ``path`` again and
    waits on that. The holder removes ``path`` while it still holds the lock, so at most one process
    at a time holds the lock on the file ``path`` names.
    """
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:  # removed by the holder we waited for
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        os.close(fd)  # (closing releases the lock on the removed file)
    try:
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:  # removed by hand: nothing to do
            pass
        finally:
            os.close(fd)


@contextmanager
def _migration_lock(db) -> Iterator[None]:
    if db.dialect == "sqlite":
        with file_lock(migration_lock_path(db.url.path)):
            yield
        return
    conn = db.connection()
    conn.execute(queries.SCHEMA_MIGRATION_LOCK, (_PG_LOCK_ID,))
    try:
        yield
    finally:
        conn.execute(queries.SCHEMA_MIGRATION_UNLOCK, (_PG_LOCK_ID,))


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

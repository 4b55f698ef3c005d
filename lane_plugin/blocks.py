"""``LaneLedger``: a Prefect block that names the ledger, its URL kept as a secret.

This module is the package's ``prefect.collections`` entry point: Prefect
imports it when it loads collections (``prefect server start``, workers, block
lookups), which registers the block type, so the UI lists *Lane Ledger* under
Blocks without ``prefect block register``. Save one, then point anything at it
by name::

    LaneLedger(url="postgresql+psycopg://lane:secret@db:5432/lane").save("prod")

    @lane_task(stage="draft", estimate=900, ledger="lane-ledger/prod")
    lane --db block:lane-ledger/prod lanes
    LANE_DATABASE_URL=block:lane-ledger/prod prefect worker start --pool lane-ops

Loading a block asks the Prefect API (``PREFECT_API_URL``, or the ephemeral
server when it is unset); each block is read once per process.
"""

from __future__ import annotations

import threading

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from .errors import DatabaseError

SLUG = "lane-ledger"
_loaded: dict[str, str] = {}
_lock = threading.Lock()


class LaneLedger(Block):
    """Where a lane ledger lives: a SQLite file, or a PostgreSQL database every worker shares.

    Example:
        >>> LaneLedger(url="sqlite:////srv/lane/lane.db").save("prod")        # doctest: +SKIP
        >>> LaneLedger.load("prod").url.get_secret_value()                    # doctest: +SKIP
        'sqlite:////srv/lane/lane.db'
    """

    _block_type_name = "Lane Ledger"
    _block_type_slug = SLUG
    _description = (
        'The token ledger of lane_plugin. Use it by name: ledger="lane-ledger/NAME" in @lane_task, '
        "--db block:lane-ledger/NAME on the lane command line, LANE_DATABASE_URL=block:lane-ledger/NAME "
        'for workers, or db="block:lane-ledger/NAME" for the scheduled flows.'
    )

    url: SecretStr = Field(
        ..., title="Ledger URL", description="sqlite:///PATH or postgresql+psycopg://user:password@host:5432/db"
    )


def _redact(text: str) -> str:
    """An API URL or error without a password (an API URL may carry user:password@ too)."""
    from .redaction import redact

    return redact(text)


def _api() -> str:
    from prefect.settings import PREFECT_API_URL

    return _redact(PREFECT_API_URL.value() or "") or "the ephemeral Prefect server (PREFECT_API_URL is unset)"


def load_url(name: str) -> str:
    """The ledger URL saved in block ``lane-ledger/<name>`` (read once per process).

    Raises:
        DatabaseError: no Prefect API answered, or it has no such block.
    """
    with _lock:
        if name in _loaded:
            return _loaded[name]
    try:
        block = LaneLedger.load(name)
    except ValueError:  # Prefect: "Unable to find block document named ..."
        raise DatabaseError(
            f"no block {SLUG}/{name} at {_api()}: save one with LaneLedger(url=...).save({name!r}) "
            "or create it in the UI (Blocks)"
        ) from None
    except Exception as exc:
        raise DatabaseError(
            f"cannot load block {SLUG}/{name}: loading a block needs a Prefect API, and {_api()} did not "
            f"answer ({type(exc).__name__}: {' '.join(_redact(str(exc)).split())[:160]}). Start one with "
            "'prefect server start', or give the ledger URL itself"
        ) from None
    url = block.url.get_secret_value()
    with _lock:
        _loaded[name] = url
    return url


__all__ = ["LaneLedger", "SLUG", "load_url"]

"""Every ``LANE_*`` setting, read in one place (pydantic-settings).

==============================  =====================================================
``LANE_DATABASE_URL``           where the ledger lives: ``sqlite:///PATH``,
                                ``postgresql+psycopg://...`` or a block,
                                ``block:lane-ledger/prod`` (default: ``lane.db`` under
                                ``PREFECT_HOME``, usually ``~/.prefect/lane.db``)
``LANE_MISSING_USAGE``          ``estimate`` (bill the estimate and warn) or ``fail``
                                when a gated body reports no token usage
``LANE_TRACES_DIR``             where ``lane simulate`` and the provider emulator look
                                for trace files by name
``LANE_SEND_SLACK_SECONDS``     how long after a gated task picks its lease up its
                                request may take to reach the provider (default 0.5 s,
                                at most 5% of the lane's window; a value set is used as is):
                                the burst window counts the rate charge from then, so
                                a provider's own sliding window never sees a charge
                                the lane already let go of
``LANE_SIGTERM_GRACE_SECONDS``  how long a gated process may take to exit after SIGTERM
                                before it is ended with ``os._exit(143)`` (default 8;
                                0: no handler); its leases are given back first
                                (:mod:`lane_plugin.gating.termination`)
``LANE_PG_POOL``                PostgreSQL connections a process keeps per ledger,
                                shared by its threads (default 8; each transaction
                                holds one only while it runs): lower it when many
                                processes share a server's ``max_connections``
``LANE_SEND_GUARD``             ``true`` (default) or ``false``: whether a gated body's
                                httpx requests are held while its lane is paused and a
                                429 pauses the lane the moment httpx has it
                                (:mod:`lane_plugin.gating.send_guard`)
``LANE_PROVIDER_HOSTS``         hosts the send guard treats as the provider's besides
                                the LLM SDKs' requests and the hosts that answered with
                                a provider's rate-limit headers: comma-separated
                                ``host``, ``host:port`` or ``*.domain`` (e.g.
                                ``llm-proxy.internal:4000,*.openai.azure.com``); never
                                Prefect's own API
                                (:mod:`lane_plugin.gating.provider_requests`)
==============================  =====================================================

Read afresh whenever a ``LANE_*`` variable changed (a process may change its
environment, e.g. ``flows/pipeline.py --db``); otherwise the last reading is
reused, because building a settings object costs about a millisecond and the gate
asks on every task.

Example:
    >>> import os; os.environ["LANE_MISSING_USAGE"] = "fail"
    >>> lane_settings().missing_usage
    'fail'
    >>> del os.environ["LANE_MISSING_USAGE"]
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import InvalidInput


class LaneSettings(BaseSettings):
    """The plugin's settings from the environment (prefix ``LANE_``)."""

    model_config = SettingsConfigDict(env_prefix="LANE_", extra="ignore", case_sensitive=False)

    database_url: Optional[SecretStr] = Field(default=None, description="the ledger URL or block reference")
    missing_usage: Literal["estimate", "fail"] = Field(default="estimate")
    traces_dir: Optional[Path] = Field(default=None)
    send_slack_seconds: Optional[float] = Field(default=None, ge=0.0, le=60.0)  # None: 0.5 s, <= 5% of the window
    sigterm_grace_seconds: float = Field(default=8.0, ge=0.0, le=3600.0)  # 0: no SIGTERM handler
    pg_pool: int = Field(default=8, ge=1, le=1000)  # PostgreSQL connections per ledger per process
    send_guard: bool = Field(default=True)  # false: no hold of a gated body's httpx sends, no pause at the 429
    provider_hosts: str = Field(default="")  # more hosts the send guard treats as the provider's

    @field_validator("provider_hosts")
    @classmethod
    def _provider_hosts(cls, value: str) -> str:
        parse_provider_hosts(value)  # a bad entry raises here, named, when a gate is made (before its body)
        return value


_cache: dict = {}
_HOST = re.compile(r"(\*\.)?([a-z0-9_-]+(\.[a-z0-9_-]+)*|\[[0-9a-f:.]+\])(:(\d{1,5}))?")


def parse_provider_hosts(value: str) -> tuple[tuple[str, int | None], ...]:
    """``LANE_PROVIDER_HOSTS`` as ``(host, port)`` pairs (lower case; port None: any; a host ``*.domain``
    matches every name under ``domain``); a bad entry raises ValueError saying which and why.

    Example:
        >>> parse_provider_hosts("api.openai.com, LLM-proxy.internal:4000,*.openai.azure.com")
        (('api.openai.com', None), ('llm-proxy.internal', 4000), ('*.openai.azure.com', None))
        >>> parse_provider_hosts("https://api.openai.com/v1")
        Traceback (most recent call last):
        ...
        ValueError: 'https://api.openai.com/v1' is not a host: write host, host:port or *.domain, comma-separated (e.g. api.openai.com,llm-proxy.internal:4000)
    """
    out = []
    for entry in value.split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        found = _HOST.fullmatch(entry)
        port = int(found.group(5)) if found and found.group(5) else None
        if found is None or (port is not None and not 0 < port < 65536):
            raise ValueError(
                f"{entry!r} is not a host: write host, host:port or *.domain, comma-separated "
                "(e.g. api.openai.com,llm-proxy.internal:4000)"
            )
        out.append((entry.rsplit(":", 1)[0] if port is not None else entry, port))
    return tuple(out)


def lane_settings() -> LaneSettings:
    """The current settings; a bad value raises :class:`InvalidInput` naming the variable."""
    key = tuple(sorted((k, v) for k, v in os.environ.items() if k[:5].upper() == "LANE_"))
    hit = _cache.get("settings")  # single dict operations: no lock an interrupted thread could keep
    if hit is not None and hit[0] == key:
        return hit[1]
    try:
        settings = LaneSettings()
    except ValidationError as exc:
        err = exc.errors()[0]
        name = "LANE_" + str(err["loc"][0]).upper() if err.get("loc") else "LANE_*"
        raise InvalidInput(name, err.get("input"), err.get("msg", "invalid")) from None
    _cache["settings"] = (key, settings)
    return settings


def database_url() -> str | None:
    """``LANE_DATABASE_URL`` (the secret revealed: only the ledger's URL parser may see it), or None if unset.

    Set but blank is refused: ``LANE_DATABASE_URL=${UNSET}`` in a worker's env file would otherwise open the
    default SQLite ledger and spend outside the shared budget.
    """
    value = lane_settings().database_url
    if value is None:
        return None
    if not value.get_secret_value().strip():
        raise InvalidInput(
            "LANE_DATABASE_URL",
            value.get_secret_value(),
            "is set but empty (an unset variable in an env file?): unset it for the default ledger, or give a URL",
        )
    return value.get_secret_value()


__all__ = ["LaneSettings", "database_url", "lane_settings"]

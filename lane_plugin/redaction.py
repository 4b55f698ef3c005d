"""The one redaction of secrets in anything the library prints.

A ledger URL is shown by :class:`lane_plugin.ledger.url.DatabaseURL` (SQLAlchemy's rendering with the
password hidden, query secrets masked). Free text (a driver's message, an error the CLI prints, the
Prefect API URL) goes through :func:`redact`: every password parsed in this process is masked wherever
it appears, and so is anything that looks like the user info of a URL or a ``password=`` /
``sslpassword=`` query value.
"""

from __future__ import annotations

import re
import threading
from urllib.parse import quote

SECRET_PARAMS = frozenset({"password", "sslpassword"})  # query parameters whose values are secrets
MASK = "***"
# Free text: the userinfo of anything that looks like a URL, up to its last "@" (a password may hold "@", "/", "#").
_PASSWORD = re.compile(r"(://[^:/@\s]*:)\S*(@)")
_QUERY_SECRET = re.compile(r"([?&](?:ssl)?password=)[^&\s]*", re.IGNORECASE)
_KNOWN: set[str] = set()  # every password parsed in this process, as written and as decoded
_KNOWN_LOCK = threading.Lock()
_MIN_SCRUB = 4  # shorter secrets are hidden where they stand, not searched for in free text


def remember(*secrets: str) -> None:
    """Note passwords just parsed: :func:`redact` masks them in any text from now on (4 characters or more)."""
    with _KNOWN_LOCK:
        for secret in secrets:
            for form in {secret, quote(secret, safe=""), quote(secret)}:
                if len(form) >= _MIN_SCRUB:
                    _KNOWN.add(form)


def redact(text) -> str:
    """Mask passwords in free text: every password parsed so far, URL userinfo, ``?password=`` / ``?sslpassword=``."""
    out = str(text)
    with _KNOWN_LOCK:
        known = sorted(_KNOWN, key=len, reverse=True)
    for secret in known:
        if secret in out:
            out = out.replace(secret, MASK)
    return _QUERY_SECRET.sub(r"\1" + MASK, _PASSWORD.sub(r"\1" + MASK + r"\2", out))

"""Waiting for a lease from a plain script: poll :meth:`Ledger.acquire` with backoff."""

from __future__ import annotations

import time

from .api import Ledger
from .db import JITTER
from .jobs import Lease


def wait_and_acquire(ledger: Ledger, job_id: str, *, timeout: float, poll: float = 0.2) -> Lease | None:
    """Poll :meth:`Ledger.acquire` with jittered backoff; None if ``timeout`` passes first."""
    end = time.monotonic() + timeout
    delay = poll
    while True:
        lease = ledger.acquire(job_id)
        if lease is not None or time.monotonic() >= end:
            return lease
        time.sleep(min(delay * (0.5 + JITTER.random()), max(0.0, end - time.monotonic())))
        delay = min(delay * 1.5, 2.0)

"""A worker process for the two-process pause test: submit a job, poll for its lease, "send", settle; again.

Usage: python -m tests.ledger.pause_worker URL LANE SECONDS
Prints one JSON line: the number of jobs it ran.
"""

from __future__ import annotations

import json
import sys
import time

from lane_plugin import Ledger
from lane_plugin.ledger import wait_and_acquire


def main(url: str, lane: str, seconds: float) -> None:
    led = Ledger(url)
    ran = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        job = led.submit("send", 10, lane)
        lease = wait_and_acquire(led, job, timeout=30.0, poll=0.02)
        if lease is None:
            break
        led.settle(lease, 10)
        ran += 1
    print(json.dumps({"ran": ran}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], float(sys.argv[3]))

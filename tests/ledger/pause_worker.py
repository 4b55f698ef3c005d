"""A worker process for the two-process pause test: a gated block ("send") again and again, as a task would.

Usage: python -m tests.ledger.pause_worker URL LANE STOP_FILE [MAX_SECONDS]
It runs until STOP_FILE exists (or MAX_SECONDS, default 120, have passed), so a slow start on a loaded machine
cannot end it before the test has seen it send.
Each block is :func:`lane_plugin.gate`: intake, admission, the provider-pause check before the body, then the
body (which only notes the moment it would send) and the settlement. Prints one JSON line: the number of
blocks it ran and the moments (epoch seconds) their bodies began.
"""

from __future__ import annotations

import json
import os
import sys
import time

from lane_plugin import Ledger, gate


def main(url: str, lane: str, stop_file: str, seconds: float = 120.0) -> None:
    led = Ledger(url)
    sent: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not os.path.exists(stop_file):
        with gate(stage="send", estimate=10, lane=lane, ledger=led, key=f"send-{len(sent)}-{time.time()}") as g:
            sent.append(time.time())  # the request would leave now
            g.report(10)
    print(json.dumps({"ran": len(sent), "sent": sent}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *map(float, sys.argv[4:5]))

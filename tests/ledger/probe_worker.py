"""A worker process for the two-process probe test: ``N`` gated blocks at once in threads, as a task runner's
workers would, each body "sending" one request that takes ``HOLD`` seconds.

Usage: python -m tests.ledger.probe_worker URL LANE N HOLD
It prints ``ready`` once its ledger is open and starts its blocks when a line comes on stdin. Each block is :func:`lane_plugin.gate` (intake, admission, the provider-pause check before the body, the body,
the settlement). Prints one JSON line: ``[start, end]`` (epoch seconds) of every body, and whether each one
waited for the lane to reopen before it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from lane_plugin import Ledger, gate


def main(url: str, lane: str, n: int, hold: float) -> None:
    led = Ledger(url)
    sent: list[tuple[float, float, bool]] = []
    ready = threading.Barrier(n)

    def one(k: int) -> None:
        ready.wait()
        with gate(stage="send", estimate=10, lane=lane, ledger=led, key=f"probe-{os.getpid()}-{k}") as g:
            start = time.time()  # the request would leave now
            time.sleep(hold)
            sent.append((start, time.time(), g._waited_pause))
            g.report(10)

    with gate(stage="warm", estimate=10, lane=f"{lane}-warm", ledger=led, key=f"warm-{os.getpid()}") as g:
        g.report(10)  # a gate's first use (its imports, the ledger's connections) before the go
    print("ready", flush=True)
    sys.stdin.readline()
    threads = [threading.Thread(target=one, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    led.close()
    print(json.dumps({"pid": os.getpid(), "sent": sent}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))

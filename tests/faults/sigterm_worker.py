"""A gated worker that hangs, for the SIGTERM tests: ``python sigterm_worker.py STUCK PREVIOUS URL LANE N``.

The main thread first opens the ledger through :func:`lane_plugin.gating.get_ledger` (as ``lane_task``'s
decoration does at import), which installs the gate's SIGTERM handler, unless ``PREVIOUS`` is ``exit`` and
the process installs its own handler first (``sys.exit(0)``, as many services do), in front of which the
gate's then sits. N threads each gate a job keyed ``stuck-<i>`` and never leave its body:

- ``STUCK=sleep``: the body sleeps for an hour;
- ``STUCK=lock``: a thread takes a lock and never lets it go; every body, and then the main thread, waits
  to take it.

The main thread joins the gated threads (``sleep``) or waits for the lock (``lock``). Each body prints
``in <i>`` once it holds its lease.
"""

from __future__ import annotations

import signal
import sys
import threading
import time


def main(stuck: str, previous: str, url: str, lane: str, n: str) -> None:
    from lane_plugin import gate
    from lane_plugin.gating import get_ledger

    if previous == "exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    get_ledger(url)
    held = threading.Lock()
    taken = threading.Event()

    def hold_forever() -> None:
        held.acquire()
        taken.set()
        threading.Event().wait()

    if stuck == "lock":
        threading.Thread(target=hold_forever, name="holds-the-lock", daemon=True).start()
        taken.wait()

    def body(i: int) -> None:
        with gate(stage="stuck", estimate=100, lane=lane, ledger=url, key=f"stuck-{i}", attempt=1):
            print(f"in {i}", flush=True)
            if stuck == "lock":
                held.acquire()
            else:
                time.sleep(3600)

    threads = [threading.Thread(target=body, args=(i,), name=f"gated-{i}") for i in range(int(n))]
    for t in threads:
        t.start()
    if stuck == "lock":
        held.acquire()
    for t in threads:
        t.join()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""A gated worker that hangs, for the SIGTERM tests: ``python sigterm_worker.py STUCK PREVIOUS URL LANE N``.

The main thread first opens the ledger through :func:`lane_plugin.gating.get_ledger` (as ``lane_task``'s
decoration does at import), which installs the gate's SIGTERM handler in front of Python's default
(``PREVIOUS=default``) or of a handler the process installs first: ``exit`` (``sys.exit(0)``, as many
services do) or ``ignore`` (a handler that does nothing). N threads each gate a job keyed ``stuck-<i>`` and never leave its body:

- ``STUCK=sleep``: the body sleeps for an hour;
- ``STUCK=lock``: a thread takes a lock and never lets it go; every body, and then the main thread, waits
  to take it.

The main thread joins the gated threads (``sleep``) or waits for the lock (``lock``). Each body prints
``in <i>`` once it holds its lease.

``STUCK=flow`` runs a Prefect flow instead (``PREFECT_API_URL`` names the server): N ``lane_task`` tasks
submitted to its thread pool, each sleeping for an hour, the flow waiting for their results under
Prefect's own SIGTERM bridge. It prints ``flow-run <id>`` first.
"""

from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time


def run_flow(url: str, lane: str, n: int) -> None:
    from prefect import flow
    from prefect.runtime import flow_run

    from lane_plugin import lane_task

    @lane_task(stage="stuck", estimate=100, lane=lane, ledger=url)
    def stuck(i: int) -> int:
        print(f"in {i}", flush=True)
        time.sleep(3600)
        return i

    @flow(name="hung")
    def hung() -> None:
        print(f"flow-run {flow_run.id}", flush=True)
        futures = [stuck.submit(i) for i in range(n)]
        for f in futures:
            f.result()

    hung()


def main(stuck: str, previous: str, url: str, lane: str, n: str) -> None:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's dump of every stack if it is stuck
    if stuck == "flow":
        run_flow(url, lane, int(n))
        return
    from lane_plugin import gate
    from lane_plugin.gating import get_ledger

    if previous == "exit":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    elif previous == "ignore":  # a process that chooses to live on through SIGTERM
        signal.signal(signal.SIGTERM, lambda *_: None)
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

"""A process of gated waiters for the waiter-gone fault tests: ``python gated_worker.py MODE URL LANE N HOLD OUT``.

``MODE`` is ``hold`` (N threads each gate a job keyed ``dead-<i>`` and hold it for HOLD seconds: the
parent kills this process with SIGKILL while some hold leases and the rest wait) or ``run`` (N threads
each gate a job keyed ``live-<i>`` and hold it HOLD seconds; the wall time from the first intake to
the last settlement is written to OUT as JSON).
"""

from __future__ import annotations

import json
import sys
import threading
import time


def main(mode: str, url: str, lane: str, n: str, hold: str, out: str) -> None:
    from lane_plugin import gate

    errors: list[str] = []
    t0 = time.monotonic()

    def one(i: int) -> None:
        try:
            with gate(
                stage=mode,
                estimate=100,
                lane=lane,
                ledger=url,
                key=f"{'dead' if mode == 'hold' else 'live'}-{i}",
                attempt=1,
                run_key=f"{mode}-run",
            ) as g:
                time.sleep(float(hold))
                g.report(10)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(int(n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(out, "w") as fh:
        json.dump({"wall": time.monotonic() - t0, "errors": errors}, fh)


if __name__ == "__main__":
    main(*sys.argv[1:])

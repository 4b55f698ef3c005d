"""A worker process for the multi-process store tests: submit, tick, settle in a loop.

Usage: python -m tests.ledger.worker URL LANE JOBS SEED
Prints one JSON line: jobs submitted, leases taken, settlements made, errors seen.
"""

from __future__ import annotations

import json
import random
import sys
import time

from lane_plugin import LaneError, Ledger


def main(url: str, lane: str, jobs: int, seed: int) -> None:
    rnd = random.Random(seed)
    led = Ledger(url)
    submitted = [led.submit("mp", rnd.randint(1, 50), lane) for _ in range(jobs)]
    leased = settled = idle = 0
    errors: list[str] = []
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            leases = led.tick(lane)
        except LaneError as exc:
            errors.append(str(exc))
            continue
        leased += len(leases)
        for lease in leases:
            led.settle(lease, max(0, int(lease.est * rnd.uniform(0.5, 1.3))))
            settled += 1
        if leases:
            idle = 0
            continue
        idle += 1
        row = led.lane(lane)
        waiting = led.rows("select count(*) from job where lane = :l and state = 'new'", {"l": lane})[1][0][0]
        if waiting == 0 or (row.leased == 0 and idle > 20):
            break  # nothing left, or the budget is spent and nobody holds a lease
        time.sleep(rnd.uniform(0, 0.01))
    print(json.dumps({"submitted": len(submitted), "leased": leased, "settled": settled, "errors": errors}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))

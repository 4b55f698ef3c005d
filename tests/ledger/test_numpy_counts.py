"""Token counts that come out of pandas are numpy integers: the ledger takes them as the counts they are.

An outside review found ``np.int64`` refused for ``est`` and ``actual`` ("expected a whole number")
while ``np.float64(12.0)`` was taken: a data team settling from a DataFrame of usage hit it. A bool,
numpy's included, is still not a count, nor is a fraction of a token.
"""

from __future__ import annotations

import numpy as np
import pytest

from lane_plugin import InvalidInput


def test_numpy_integers_are_counts_and_are_stored_as_plain_integers(led):
    led.set_lane(
        "np",
        allowance=10**6,
        ceiling=np.int64(10**6),
        start_fraction=1.0,
        burst_tokens=np.int32(10**5),
        max_leased=np.int64(4),
        lease_seconds=60,
    )
    job = led.submit("s", np.int64(1_200), "np", rate_cost=np.uint16(3_000))
    (lease,) = led.tick("np")
    settled = led.settle(lease.job_id, np.int64(1_350), attempt=lease.attempt)
    assert (settled.est, settled.actual, settled.overage) == (1_200, 1_350, 150)
    assert type(settled.actual) is int and type(lease.est) is int
    row = led.lane("np")
    assert (row.spent, row.reserved, row.ceiling, row.max_leased) == (1_350, 0, 10**6, 4)
    assert led.job(job)["state"] == "done" and led.audit() == []


@pytest.mark.parametrize("bad", [np.bool_(True), True, np.float64(12.5), np.float64("nan"), np.int64(-5)])
def test_a_numpy_bool_a_fraction_or_a_negative_is_refused_naming_the_field(led, bad):
    led.set_lane("np", allowance=10**6, ceiling=10**6, max_leased=4, lease_seconds=60)
    with pytest.raises(InvalidInput, match="est"):
        led.submit("s", bad, "np")
    assert [lane["waiting"] for lane in led.lanes() if lane["lane"] == "np"] == [0]  # nothing half-written

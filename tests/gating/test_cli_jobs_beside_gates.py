"""A gate leases no job it will not run: jobs queued with ``lane submit`` beside gated tasks wait for
``lane tick`` (an outside review's finding: a gate's tick leased them and dropped the leases, which
expired unrun, each costing the job an attempt, until the job was parked)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from lane_plugin import gate
with gate(stage="critique", estimate=300, lane="mix", ledger=sys.argv[1]) as g:
    g.report(250)
print("settled", flush=True)
"""


def test_a_gate_in_another_process_leaves_cli_jobs_to_lane_tick(tmp_path):
    from lane_plugin import Ledger

    url = f"sqlite:///{tmp_path / 'lane.db'}"
    led = Ledger(url)
    led.set_lane("mix", allowance=100_000, ceiling=100_000, max_leased=5, lease_seconds=1.0)
    small, big = led.submit("cli", 10, "mix"), led.submit("cli", 20_000, "mix")  # both fit, first in the order
    out = subprocess.run([sys.executable, "-c", SCRIPT, url], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "settled" in out.stdout, out.stderr[-2000:]
    _, rows = led.rows("select stage, state, attempt from job order by created_at")
    assert rows == [("cli", "new", 1), ("cli", "new", 1), ("critique", "done", 1)]
    assert led.reap().requeued == []  # no lease of theirs to expire
    assert {x.job_id for x in led.tick("mix")} == {small, big}  # `lane tick` pulls them, first attempts
    assert led.audit() == []
    led.close()

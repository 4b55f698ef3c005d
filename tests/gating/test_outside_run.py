"""Issue 14 item 4: outside a Prefect run, gate() sends events only to a configured API and starts no
server; nothing it starts outlives its process (checked on a real subprocess and every process left)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

SCRIPT = """
import sys, threading
from lane_plugin import Ledger, gate
url = sys.argv[1]
Ledger(url).set_lane("o", allowance=10_000, ceiling=10_000, max_leased=2)
def one(i):
    with gate(stage="outside", estimate=10, lane="o", ledger=url) as g:
        g.report(7)
threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("settled", Ledger(url).rows("select count(*) from settlement")[1][0][0], flush=True)
"""


def _marked(marker: str) -> list[str]:
    """Processes alive now that inherited ``marker`` in their environment (children of the script)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() in (d / "environ").read_bytes():
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{d.name}: {cmd[:200]}")
        except OSError:
            continue
    return out


def test_gate_outside_a_run_starts_no_server_and_leaves_no_process(tmp_path):
    marker = f"LANE_TEST_MARKER={uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(
        PREFECT_HOME=str(tmp_path / "home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        LANE_TEST_MARKER=marker.split("=", 1)[1],
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 'l.db'}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - t0
    assert done.returncode == 0, done.stderr[-3000:]
    assert "settled 4" in done.stdout
    time.sleep(1.0)  # a child that was going to exit with its parent has done so
    stray = _marked(marker)
    assert stray == [], f"processes outlived the gate's process: {stray}"
    assert took < 60, f"4 gated blocks outside a run took {took:.1f}s"

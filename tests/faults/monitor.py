"""A monitor thread that samples a lane and audits the ledger while workers run."""

from __future__ import annotations

import threading


class Monitor(threading.Thread):
    """Samples ``spent``, ``reserved`` and the audit every ``every`` seconds until stopped."""

    def __init__(self, url: str, lane: str = "free", every: float = 0.05, audit_every: int = 5):
        super().__init__(daemon=True)
        from lane_plugin import Ledger

        self.led = Ledger(url, retry_for=180.0)
        self.lane, self.every, self.audit_every = lane, every, audit_every
        self.samples = 0
        self.audits = 0
        self.max_committed = 0  # spent - overage + reserved: what admission put on the lane
        self.violations: list[str] = []
        self.errors: list[str] = []
        self._stop_evt = threading.Event()

    def run(self):
        i = 0
        while not self._stop_evt.is_set():
            try:
                row = self.led.lane(self.lane)
                committed = row.spent - row.overage + row.reserved
                self.max_committed = max(self.max_committed, committed)
                if committed > row.ceiling:
                    self.violations.append(f"sample {i}: committed {committed} > ceiling {row.ceiling}")
                self.samples += 1
                if i % self.audit_every == 0:
                    bad = self.led.audit(grace=600)
                    self.audits += 1
                    self.violations += [f"audit {self.audits}: {b}" for b in bad]
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")
            i += 1
            self._stop_evt.wait(self.every)

    def stop(self):
        self._stop_evt.set()
        self.join(timeout=60)
        self.led.close()

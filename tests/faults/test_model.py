"""Item 2: a model-based test. Hypothesis drives the real store (SQLite, injected clock) and a
tiny in-memory reference model side by side; after every step the two must agree and the audit
must be clean. A failure prints its steps; replay it with ``pytest --hypothesis-seed=N``."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, multiple, precondition, rule

import lane_plugin.ledger.api as ledgermod
import lane_plugin.ledger.db as dbmod
from lane_plugin import ConflictingReplay, InvalidInput, LaneError, LeaseLost, Ledger, NotLeased
from lane_plugin.policy import HEAD_SLACK

from .conftest import FULL, late_figure

CEILING, MAX_LEASED, LEASE, MAX_ATTEMPTS, PARK = 100, 4, 10.0, 2, 1000.0
_TEMPLATE: dict = {}
RAN = {"programs": 0, "steps": 0, "settlements": 0, "late": 0}


def _template() -> Path:
    """A migrated ledger file, copied for each example (migrating per example is slow)."""
    if "path" not in _TEMPLATE:
        d = Path(tempfile.mkdtemp(prefix="lane-model-"))
        led = Ledger(f"sqlite:///{d / 'template.db'}")
        led.set_lane("free", allowance=CEILING, ceiling=CEILING, start_fraction=1.0, burst_tokens=10**9,
                     max_leased=MAX_LEASED, lease_seconds=LEASE, max_wait_seconds=10**8,
                     max_attempts=MAX_ATTEMPTS, park_seconds=PARK)  # fmt: skip
        led.close()
        _TEMPLATE["path"] = d / "template.db"
    return _TEMPLATE["path"]


class _Ids:
    """Deterministic uuid4 for the ledger module: job ids decide admission ties, and a program
    must replay exactly (the same seed, the same jobs, the same choices)."""

    def __init__(self):
        import uuid

        self._uuid, self.n = uuid, 0

    def uuid4(self):
        self.n += 1
        return self._uuid.UUID(int=self.n)

    def __getattr__(self, name):
        return getattr(self._uuid, name)


class Crash(Exception):
    """A simulated crash at a fault point (the process would have died here)."""


class LedgerMachine(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    def __init__(self):
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="lane-model-"))
        shutil.copy(_template(), self.dir / "ledger.db")
        self.t = 1_000_000.0
        self._real_uuid, ledgermod.uuid = ledgermod.uuid, _Ids()
        self.led = Ledger(f"sqlite:///{self.dir / 'ledger.db'}", clock=lambda: self.t)
        # the reference model
        self.m: dict[str, dict] = {}
        self.keys: dict[str, tuple[str, int]] = {}
        self.settled: dict[tuple[str, int], int] = {}
        self.spent = self.reserved = self.overage = self.leased = 0
        self.tokens: dict[str, str] = {}
        self.seq = 0

    def teardown(self):
        RAN["programs"] += 1
        RAN["settlements"] += len(self.settled)
        ledgermod.uuid = self._real_uuid
        self.led.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- steps ----------------------------------------------------------------------
    @initialize()
    def start(self):
        pass

    @rule(target=jobs, est=st.sampled_from([10, 25, 50]) | st.integers(1, 60), key=st.none() | st.sampled_from(["k1", "k2", "k3"]))
    def submit(self, est, key):
        if key in self.keys and self.keys[key][1] != est:
            with pytest.raises(ConflictingReplay):
                self.led.submit("model", est, "free", key=key)
            return multiple()
        job = self.led.submit("model", est, "free", key=key)
        if key in self.keys:
            assert job == self.keys[key][0], "one key made two jobs"
            return multiple()
        self.seq += 1
        self.m[job] = dict(est=est, state="new", attempt=1, lease_attempt=0, lease_until=0.0, actual=0,
                           wait_since=self.t, seq=self.seq)  # fmt: skip
        if key is not None:
            self.keys[key] = (job, est)
        return job

    @rule(target=jobs, ests=st.lists(st.sampled_from([10, 25, 50]) | st.integers(1, 60), min_size=2, max_size=8))
    def submit_many(self, ests):
        return multiple(*[self.submit(est, None) for est in ests])

    @rule()
    def tick(self):
        """The policy, restated: the head of the queue by priority (wait_since + est * age factor); the
        first job that does not fit holds a shadow (its tokens and a slot); a job that spend alone leaves
        no room for is parked (this lane has no period); nothing is read while every slot is taken."""
        expect, parked = [], []
        free = MAX_LEASED - self.leased
        if free > 0:
            age = 10**8 / CEILING  # max_wait_seconds / min(ceiling, burst)
            waiting = sorted((j for j in self.m if self.m[j]["state"] == "new"),
                             key=lambda j: (self.m[j]["wait_since"] + self.m[j]["est"] * age, j))  # fmt: skip
            committed, leased, sh_est, sh_slot = self.spent + self.reserved, self.leased, 0, 0
            for j in waiting[: free + HEAD_SLACK]:
                est = self.m[j]["est"]
                if self.spent + est > CEILING:
                    parked.append(j)
                elif leased + sh_slot + 1 > MAX_LEASED:
                    continue
                elif committed + sh_est + est <= CEILING:
                    expect.append(j)
                    committed += est
                    leased += 1
                elif not sh_slot:
                    sh_est, sh_slot = est, 1
        leases = self.led.tick("free")
        assert sorted(x.job_id for x in leases) == sorted(expect), "admission diverged from the model"
        for j in parked:
            self.m[j]["state"] = "parked"
        for x in leases:
            job = self.m[x.job_id]
            assert x.attempt == job["attempt"] and x.lease_until == self.t + LEASE
            job.update(state="leased", lease_attempt=job["attempt"], lease_until=self.t + LEASE)
            self.reserved += job["est"]
            self.leased += 1
            self.tokens[x.job_id] = x.token

    @rule(job=jobs)
    def renew(self, job):
        m, token = self.m[job], self.tokens.get(job, "no-token")
        if m["state"] == "leased" and token is not None:
            assert self.led.renew(job, token) == self.t + LEASE
            m["lease_until"] = self.t + LEASE
        else:  # a token of a lease that ended (or none at all: InvalidInput)
            with pytest.raises(LeaseLost if token else InvalidInput):
                self.led.renew(job, token)

    def _expect_settle(self, job, attempt, actual):
        m = self.m[job]
        if (job, attempt) in self.settled:
            return ("replay", self.settled[(job, attempt)])
        if attempt > m["lease_attempt"] or attempt < 1:
            return ("notleased", None)
        return ("bill", m["state"] == "leased" and m["attempt"] == attempt)

    def _apply_settle(self, job, attempt, actual, live, outcome):
        m = self.m[job]
        self.settled[(job, attempt)] = actual
        m["actual"] += actual
        self.spent += actual
        if live:
            m["state"] = outcome
            self.reserved -= m["est"]
            self.leased -= 1
            self.overage += max(0, actual - m["est"])
            self.tokens[job] = None
        else:
            self.overage += actual
            RAN["late"] += 1

    @rule(job=jobs, back=st.integers(0, 2), actual=st.integers(0, 70), failed=st.booleans())
    def settle(self, job, back, actual, failed):
        self._settle(job, back, actual, failed)

    def _settle(self, job, back, actual, failed):
        attempt = self.m[job]["attempt"] - back
        outcome = "failed" if failed else "done"
        kind, info = self._expect_settle(job, attempt, actual)
        if kind == "notleased" or attempt < 1:
            with pytest.raises((NotLeased, LaneError)):
                self.led.settle(job, actual, attempt=attempt, outcome=outcome)
            return
        r = self.led.settle(job, actual, attempt=attempt, outcome=outcome)
        if kind == "replay":
            assert r.replay and r.actual == info, "a replay billed again or returned another result"
            return
        assert not r.replay and r.late is (not info)
        self._apply_settle(job, attempt, actual, info, outcome)

    @precondition(lambda self: any(m["state"] == "leased" for m in self.m.values()))
    @rule(i=st.integers(0, 10**6), actual=st.integers(0, 70), failed=st.booleans())
    def settle_leased(self, i, actual, failed):
        """Settle a job that holds a lease (the common case, so programs reach it often)."""
        leased = sorted(j for j, m in self.m.items() if m["state"] == "leased")
        self._settle(leased[i % len(leased)], 0, actual, failed)

    @rule(job=jobs, actual=st.integers(0, 70), where=st.sampled_from(["before_commit", "after_commit"]))
    def crash_then_retry(self, job, actual, where):
        """The settling process dies at a fault point; a retry of the same attempt follows."""
        attempt = self.m[job]["attempt"]
        kind, info = self._expect_settle(job, attempt, actual)
        if kind != "bill":
            return
        real = dbmod.fault_point

        def crash(name):
            if name == f"settle.{where}":
                raise Crash(name)

        dbmod.fault_point = crash
        try:
            with pytest.raises(Crash):
                self.led.settle(job, actual, attempt=attempt)
        finally:
            dbmod.fault_point = real
        self.led.db.discard()  # the process is gone: so is its connection
        r = self.led.settle(job, actual, attempt=attempt)
        assert r.replay is (where == "after_commit") and r.actual == actual
        self._apply_settle(job, attempt, actual, info, "done")

    @rule(dt=st.sampled_from([0.5, 5.0, 9.99, 10.0, 10.01, 30.0, 600.0]))
    def advance_clock(self, dt):
        self.t += dt

    @rule()
    def expire(self):
        """Every lease runs out, then the reaper passes."""
        self.t += LEASE + 0.01
        self.reap()

    @rule()
    def reap(self):
        moved = self.led.reap()
        want_requeued, want_parked = [], []
        for j, m in self.m.items():
            if m["state"] == "leased" and m["lease_until"] < self.t:
                self.reserved -= m["est"]
                self.leased -= 1
                self.tokens[j] = None
                if m["attempt"] < MAX_ATTEMPTS:
                    m.update(state="new", attempt=m["attempt"] + 1, lease_until=0.0)
                    want_requeued.append(j)
                else:
                    m.update(state="parked", lease_until=0.0)
                    want_parked.append(j)
        assert sorted(moved.requeued) == sorted(want_requeued)
        assert sorted(p["job_id"] for p in moved.parked) == sorted(want_parked)

    @rule(job=jobs)
    def park(self, job):
        m = self.m[job]
        assert self.led.park(job, "model says so") is (m["state"] == "new")
        if m["state"] == "new":
            m["state"] = "parked"

    @rule(job=jobs)
    def requeue(self, job):
        m = self.m[job]
        if m["state"] != "parked":
            with pytest.raises(LaneError, match="not parked"):
                self.led.requeue(job)
            return
        self.led.requeue(job)
        m.update(state="new", wait_since=self.t)
        if m["lease_attempt"] >= m["attempt"]:
            m["attempt"] += 1

    # -- agreement ------------------------------------------------------------------
    @invariant()
    def agree(self):
        RAN["steps"] += 1
        row = self.led.lane("free")
        assert (row.spent, row.reserved, row.overage, row.leased) == (
            self.spent, self.reserved, self.overage, self.leased
        ), "lane counters diverged from the model"
        rows = self.led.rows("select id, state, attempt, actual from job")[1]
        got = {r[0]: (r[1], r[2], r[3]) for r in rows}
        want = {j: (m["state"], m["attempt"], m["actual"]) for j, m in self.m.items()}
        assert got == want, "job rows diverged from the model"
        assert self.led.audit(grace=10**9) == []


LedgerMachine.TestCase.settings = settings(
    max_examples=2000 if FULL else 200, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)  # fmt: skip


TestLedgerModel = LedgerMachine.TestCase


def _model_figure() -> str | None:
    if not RAN["programs"]:
        return None
    n = LedgerMachine.TestCase.settings.max_examples
    return (f"model sqlite: {RAN['programs']} hypothesis programs (max_examples {n}), {RAN['steps']} checked steps "
           f"(submit, tick, renew, settle, replayed settle, crash-then-retry, clock, expire, reap, park, requeue), "
           f"{RAN['settlements']} settlements ({RAN['late']} late): real store and reference model never diverged; "
           "audit clean after every step")  # fmt: skip


late_figure(_model_figure)

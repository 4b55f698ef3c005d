"""A settlement (or a reap) skips its hand-off when no gated job waits in the lane (ix_job_gated, migration 0013).

The hand-off leases only gated jobs (a waiter waits for them) and parks only gone waiters' jobs: it reads the
gated head first (one read of ix_job_gated), and with none waiting in the lane it can do nothing, so the window
slide, the policy and the NOTIFY it would run are skipped. Shown by the statements a settlement runs, and by the same random scenario run with the
skip and with the hand-off forced: every decision the same. On both databases (``ledger_url``).
"""

from __future__ import annotations

import random

import pytest

from lane_plugin import Ledger
from lane_plugin.ledger import admission
from lane_plugin.ledger.db import Cursor


def lane(led, **kw):
    settings = dict(
        allowance=100_000,
        ceiling=100_000,
        start_fraction=1.0,
        burst_tokens=100_000,
        max_leased=1,
        lease_seconds=30,
        max_attempts=3,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane("h", **settings)


@pytest.fixture
def statements(monkeypatch):
    """Every statement run through a ledger cursor while the test records (``rec.on``), in order."""

    class Rec:
        on = False
        sql: list[str] = []

    real, real_many = Cursor.execute, Cursor.executemany

    def execute(self, sql, params=None):
        if Rec.on:
            Rec.sql.append(" ".join(sql.split()))
        return real(self, sql, params)

    def executemany(self, sql, rows):
        if Rec.on:
            Rec.sql.append(" ".join(sql.split()))
        return real_many(self, sql, rows)

    monkeypatch.setattr(Cursor, "execute", execute)
    monkeypatch.setattr(Cursor, "executemany", executemany)
    Rec.sql = []
    return Rec


def recorded(rec, fn):
    rec.sql, rec.on = [], True
    try:
        return fn()
    finally:
        rec.on = False


def is_head(sql: str) -> bool:
    """The admission's head read (any of its forms)."""
    return sql.startswith("select * from (select id, est, wait_since")


def heads(sqls: list[str]) -> int:
    return sum(map(is_head, sqls))


def is_gated_head(sql: str) -> bool:
    return is_head(sql) and "waiter is not null" in sql and "id = %(own)s" not in sql and "id = :own" not in sql


def acts(sqls: list[str]) -> list[str]:
    """The statements that lease, charge the window, slide it, or NOTIFY."""
    return [
        s
        for s in sqls
        if "pg_notify" in s
        or s.startswith("update job set state = 'leased'")
        or "rate_charge where lane" in s
        or s.startswith("update lane set window_used")
    ]


def test_a_settlement_with_a_gated_job_waiting_still_hands_its_room_on(led, clock, statements):
    lane(led)
    a = led.submit("s", 100, "h", waiter="w1")
    clock.t += 1
    b = led.submit("s", 100, "h", waiter="w1")
    [lease] = led.tick("h")
    assert lease.job_id == a
    commits = led.db.stats.commits
    recorded(statements, lambda: led.settle(lease, 90))
    assert led.db.stats.commits - commits == 1
    assert led.job(b)["state"] == "leased"  # handed on, in the settlement's transaction
    # one read of the gated head, which the hand-off's admission then uses (it used to check first, then read)
    assert heads(statements.sql) == 1 and is_gated_head(next(filter(is_head, statements.sql)))
    assert led.audit() == []


def test_a_settlement_with_no_gated_job_waiting_runs_no_admission_statement(led, clock, statements):
    lane(led, max_leased=1)
    cli = []
    for _ in range(3):  # waiting, but nobody waits for them: pulled by whoever ticks
        cli.append(led.submit("s", 100, "h"))
        clock.t += 1
    [lease] = led.tick("h")
    assert lease.job_id == cli[0]
    skipped = recorded(statements, lambda: (led.settle(lease, 90), list(statements.sql))[1])
    assert heads(skipped) == 1 and is_gated_head(next(filter(is_head, skipped)))  # found empty: nothing more
    assert acts(skipped) == [], skipped
    assert [led.job(j)["state"] for j in cli] == ["done", "new", "new"]  # its room kept for whoever ticks next
    # the same settlement with the hand-off forced: the same outcome, only more statements
    [lease] = led.tick("h")
    assert lease.job_id == cli[1]
    admission.SKIP_EMPTY_HANDOFF = False
    try:
        forced = recorded(statements, lambda: (led.settle(lease, 90), list(statements.sql))[1])
    finally:
        admission.SKIP_EMPTY_HANDOFF = True
    assert heads(forced) == 1 and len(forced) >= len(skipped)  # (PostgreSQL: the forced one NOTIFYs too)
    assert [led.job(j)["state"] for j in cli] == ["done", "done", "new"]
    assert [x.job_id for x in led.tick("h")] == [cli[2]]
    assert led.audit() == []


def test_a_gated_job_queued_behind_cli_jobs_is_seen_and_a_finished_one_is_not(led, clock, statements):
    """The check is of the lane's waiting gated jobs only: done ones, or another lane's, do not count."""
    lane(led, max_leased=1)
    led.set_lane("other", allowance=100_000, ceiling=100_000)
    led.submit("s", 100, "other", waiter="w1")  # another lane's gated job
    g = led.submit("s", 100, "h", waiter="w1")
    [lg] = led.tick("h")
    assert lg.job_id == g
    cli = led.submit("s", 50, "h")  # first in the order, but nobody waits for it
    late = led.submit("s", 100, "h", waiter="w1")
    sql = recorded(statements, lambda: (led.settle(lg, 100), list(statements.sql))[1])
    assert heads(sql) == 1  # a gated job waits: the hand-off runs, and leases it (a CLI job is a tick's)
    assert (led.job(cli)["state"], led.job(late)["state"]) == ("new", "leased")
    sql = recorded(statements, lambda: (led.settle(late, 100, attempt=1), list(statements.sql))[1])
    # the lane's gated jobs are all done (its head read is empty); the other lane's does not count
    assert acts(sql) == []
    assert led.job(cli)["state"] == "new"
    [lc] = led.tick("h")
    assert lc.job_id == cli
    assert led.audit() == []


def test_the_gated_head_from_the_partial_index_is_the_gated_head_from_the_queue(led, clock):
    """WAITERS_HEAD_SQL (ix_job_gated) returns GATED_HEAD_SQL's rows (ix_job_queue, no own job), in its order."""
    lane(led, max_leased=50)
    rng = random.Random(7)
    for i in range(120):
        clock.t += rng.choice((0.0, 0.5))  # ties in prio: the id orders them
        led.submit(
            "s",
            rng.choice((10, 50, 200)),
            "h",
            waiter=rng.choice(("w1", "w2", None, None)),
            run_key=rng.choice((None, None, "r1")),
        )
        if i % 17 == 0:
            led.tick("h")  # some leased (a run under way: its later jobs are finishing ones)

    def read(cur):
        sql = admission.WAITERS_HEAD_SQLITE if cur.dialect == "sqlite" else admission.WAITERS_HEAD_SQL
        out = []
        for k in (1, 3, 16, 200):
            p = {"l": "h", "k": k, "f": False, "t": True}
            out.append((cur.all(sql, p), cur.all(admission.GATED_HEAD_SQL, {**p, "own": None})))
        return out

    for fast, slow in led.db.transaction(read):
        assert [tuple(r) for r in fast] == [tuple(r) for r in slow]
    assert len(fast) > 16 and any(
        r[9] is None
        for r in led.db.transaction(
            lambda cur: cur.all(admission.HEAD_SQL, {"l": "h", "k": 200, "f": False, "t": True})
        )
    )


def test_a_reap_with_no_gated_job_waiting_skips_the_hand_off_and_requeues(led, clock, statements):
    lane(led, lease_seconds=10)
    a = led.submit("s", 100, "h")
    b = led.submit("s", 100, "h")
    [la] = led.tick("h")
    clock.t += 11
    moved = recorded(statements, led.reap)
    assert moved.requeued == [la.job_id] and acts(statements.sql) == [], statements.sql
    assert (led.job(a)["state"], led.job(b)["state"]) == ("new", "new")
    assert led.tick("h")[0].job_id in (a, b)
    assert led.audit() == []


def test_sqlite_reads_the_partial_index_not_the_queue(sqlite_url):
    led = Ledger(sqlite_url)
    try:
        lane(led)
        p = {"l": "h", "k": 5, "f": False, "t": True}
        plan = " ".join(r[-1] for r in led.rows("explain query plan " + admission.WAITERS_HEAD_SQLITE, p)[1])
        assert plan.count("USING INDEX ix_job_gated (lane=? AND finishing=?)") == 2 and "TEMP B-TREE" not in plan, plan
    finally:
        led.close()


# -- the same random scenario with the skip and with the hand-off forced: the same decisions ----------
def scenario(url: str, clock, seed: int) -> list:
    """Submits (gated by two waiters, one of which goes silent, and CLI), ticks, settles, reaps; a snapshot."""
    rng = random.Random(seed)
    led = Ledger(url, clock=clock)
    try:
        lane(
            led,
            max_leased=3,
            ceiling=50_000,
            allowance=50_000,
            burst_tokens=2_000,
            window_seconds=10,
            lease_seconds=15,
            max_wait_seconds=60,
        )
        ids: list[str] = []
        alive = {"w1", "w2"}
        for step in range(200):
            clock.t += rng.choice((0.2, 1.0, 3.0))
            for w in sorted(alive):
                led.heartbeat(w)
            if step == 90:
                alive.discard("w2")  # goes silent: its waiting jobs are parked as gone
            op = rng.random()
            if op < 0.35:
                # gated jobs of both waiters, then of w1 only, then none: the gated queue drains, CLI jobs go on
                who = rng.choice((("w1", "w2", None), ("w1", None, None), (None,))[min(2, step // 60)])
                ids.append(
                    led.submit(
                        "s", rng.choice((50, 120, 300, 700)), "h", waiter=who, run_key=rng.choice((None, "r1", "r2"))
                    )
                )
            elif op < 0.55:
                led.tick("h")
            elif op < 0.9:
                live = [j for j in ids if led.job(j)["state"] == "leased"]
                if live:
                    j = rng.choice(live)
                    led.settle(j, rng.choice((0, 80, 150, 400)), attempt=led.job(j)["lease_attempt"])
            else:
                led.reap()
        led.tick("h")  # both slide the window and lapse reserves here, whatever a skipped hand-off left
        row = led.lane("h")
        jobs = [
            (
                led.job(j)["state"],
                led.job(j)["attempt"],
                led.job(j)["lease_attempt"],
                led.job(j)["actual"],
                led.job(j)["reason"],
            )
            for j in ids
        ]
        assert led.audit() == []
        return [jobs, (row.spent, row.reserved, row.leased, row.window_used, row.finishing, row.overage)]
    finally:
        led.close()


@pytest.mark.parametrize("seed", [1, 2])
def test_the_skip_changes_no_decision(ledger_url, tmp_path, clock, monkeypatch, seed):
    from tests.conftest import PgSchema, postgres_or_skip

    seen = {"skips": 0, "handed": [0, 0]}  # hand-offs skipped; jobs leased by hand-offs (skip run, forced run)
    real_tick = admission.tick

    def tick(*a, **kw):
        got = real_tick(*a, **kw)
        if kw.get("handoff"):
            seen["skips"] += got is None
            seen["handed"][run] += 0 if got is None else len(got.leases)
        return got

    monkeypatch.setattr(admission, "tick", tick)
    start, run = clock.t, 0
    skipped = scenario(ledger_url, clock, seed)
    if ledger_url.startswith("sqlite"):
        other, drop = f"sqlite:///{tmp_path / 'forced.db'}", None
    else:
        schema = PgSchema(postgres_or_skip())
        other, drop = schema.url, schema.drop
    try:
        monkeypatch.setattr(admission, "SKIP_EMPTY_HANDOFF", False)
        clock.t, run = start, 1
        forced = scenario(other, clock, seed)
    finally:
        if drop is not None:
            drop()
    assert skipped == forced
    # (a scenario that exercised both: hand-offs skipped, and hand-offs that leased, as many in either run)
    assert seen["skips"] > 0 and seen["handed"][0] > 0 and seen["handed"][0] == seen["handed"][1], seen

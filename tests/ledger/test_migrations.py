"""The Alembic migrations create exactly the SQLModel schema, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
import time

import pytest

from lane_plugin import DatabaseError, Ledger, NotALedger
from lane_plugin.ledger.schema import HEAD_REVISION


def test_migrated_schema_equals_the_models(ledger_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from lane_plugin.ledger.models import metadata

    led = Ledger(ledger_url)
    assert led.upgrade() == HEAD_REVISION
    engine = create_engine(led.url.sqlalchemy_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_upgrade_is_idempotent_and_first_use_creates_the_schema(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    led = Ledger(url)
    assert led.lanes()  # first use: created and upgraded
    assert Ledger(url).upgrade() == HEAD_REVISION


def test_first_use_in_a_directory_that_is_not_there_is_refused_naming_it(tmp_path):
    # a missing directory is a typo far more often than a wish (only the default ledger's home is made)
    with pytest.raises(DatabaseError, match=f"no directory {tmp_path / 'sub'} "):
        Ledger(f"sqlite:///{tmp_path / 'sub' / 'fresh.db'}").lanes()
    assert list(tmp_path.iterdir()) == []


def test_a_database_that_is_not_a_ledger_is_refused_without_writing(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("create table customers (id integer primary key)")
    conn.commit()
    conn.close()
    with pytest.raises(NotALedger, match="not a lane ledger"):
        Ledger(f"sqlite:///{path}").lanes()
    tables = {r[0] for r in sqlite3.connect(path).execute("select name from sqlite_master where type='table'")}
    assert tables == {"customers"}


def test_a_file_that_is_not_a_database_is_refused(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not SQLite\n" * 200)
    with pytest.raises(NotALedger, match="not a lane ledger"):
        Ledger(f"sqlite:///{path}").lanes()
    assert path.read_text().startswith("hello")


def test_a_ledger_at_0001_with_work_in_flight_upgrades_to_the_new_admission(ledger_url):
    """Existing jobs get rate_cost = est, their place in the new order, and their run's class."""

    db = _database_at(ledger_url, "0001")

    def seed(cur):
        cur.execute("update lane set max_wait_seconds = 100, burst_tokens = 1000, ceiling = 10000 where name = 'free'")
        cur.execute("insert into lane_run (lane, run_key, started_at) values ('free', 'r1', 5)")
        for jid, est, run_key, state in (("a", 500, "r1", "new"), ("b", 200, None, "new"), ("c", 300, "r2", "leased")):
            leased = state == "leased"
            cur.execute(
                "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, lease_token, "
                "run_key, created_at, wait_since) values (:id, 'free', 's', :e, 0, :st, 1, :la, :lu, :tok, :r, 10, 10)",
                {
                    "id": jid,
                    "e": est,
                    "r": run_key,
                    "st": state,
                    "la": int(leased),
                    "lu": time.time() + 60 if leased else 0,
                    "tok": "t" if leased else None,
                },
            )
        cur.execute(
            "update lane set reserved = 300, leased = 1, window_used = 300, window_start = 10 where name = 'free'"
        )

    db.transaction(seed)
    db.close()
    led = Ledger(ledger_url)
    assert led.upgrade() == HEAD_REVISION
    jobs = {j: led.job(j) for j in "abc"}
    assert [jobs[j]["rate_cost"] for j in "abc"] == [500, 200, 300]
    assert [jobs[j]["prio"] for j in "abc"] == [10 + 500 * 0.1, 10 + 200 * 0.1, 10 + 300 * 0.1]
    assert [bool(jobs[j]["finishing"]) for j in "abc"] == [True, False, False]
    lane = led.lane("free")
    assert (lane.rate_basis, lane.finishing, lane.window_used) == ("request", 0, 0)  # an empty window to start
    assert led.audit(grace=10**9) == []
    led.close()


def _database_at(ledger_url: str, revision: str | None = None):
    """The ledger's database as it stands, or first upgraded to ``revision``, that never upgrades itself on first use
    (a :class:`Database` does, silently to head): to write or read an older revision's schema."""
    from lane_plugin.ledger.db import Database
    from lane_plugin.ledger.schema import upgrade
    from lane_plugin.ledger.url import parse_url

    db = Database(parse_url(ledger_url))
    if revision is not None:
        upgrade(db, revision)
    db._checked = True
    return db


def _downgrade(ledger_url: str, revision: str) -> None:
    from alembic import command
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    from lane_plugin.ledger.schema import alembic_config
    from lane_plugin.ledger.url import parse_url

    engine = create_engine(parse_url(ledger_url).sqlalchemy_url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            command.downgrade(alembic_config(conn), revision)
    finally:
        engine.dispose()


def test_0012_remembers_the_lane_a_moved_job_left_while_its_charge_is_in_the_window_and_downgrades(ledger_url, clock):
    """A ledger at 0011 with a job that left lane free for paid after attempt 1 was leased in free (its charge
    still in free's window): the upgrade records the move, and a late settlement of attempt 1 bills free; a job
    that never moved gets no row. Down to 0011 drops the table; up again is head."""

    db = _database_at(ledger_url, "0011")
    t = clock.t

    def seed(cur):
        for jid, lane, att, charged in (("moved", "paid", 2, "free"), ("stayed", "free", 2, "free")):
            cur.execute(
                "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, "
                "created_at, wait_since) values (:id, :l, 's', 100, 0, 'new', :a, 1, 0, :t, :t)",
                {"id": jid, "l": lane, "a": att, "t": t - 30},
            )
            cur.execute(
                "insert into rate_charge (job_id, attempt, lane, at, cost) values (:j, 1, :l, :t, 100)",
                {"j": jid, "l": charged, "t": t - 30},
            )
        cur.execute("update lane set window_used = 200, window_start = 0 where name = 'free'")

    db.transaction(seed)
    db.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        assert led.rows("select job_id, leased_upto, lane from lane_move")[1] == [("moved", 1, "free")]
        before = led.lane("free").spent, led.lane("paid").spent
        got = led.settle("moved", 500, attempt=1)
        assert (got.lane, got.late) == ("free", True)
        assert (led.lane("free").spent - before[0], led.lane("paid").spent - before[1]) == (500, 0)
    finally:
        led.close()
    _downgrade(ledger_url, "0011")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0011"
        assert probe.transaction(lambda cur: cur.scalar("select count(*) from settlement")) == 1
    finally:
        probe.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        assert led.rows("select job_id, lane from lane_move")[1] == [("moved", "free")]  # (its charge is still there)
    finally:
        led.close()


def test_0013_indexes_the_waiting_gated_jobs_of_a_ledger_at_0012_and_downgrades(ledger_url, clock):
    """A ledger at 0012 with gated and CLI jobs: the upgrade indexes the waiting gated ones (the hand-off's check
    finds free's, and none in paid: a CLI job waits there, a gated one is done); down to 0012 drops the index; up
    again is head."""
    from lane_plugin.ledger import admission

    db = _database_at(ledger_url, "0012")

    def seed(cur):
        for jid, lane, waiter, state in (
            ("g", "free", "w1", "new"),
            ("d", "paid", "w1", "done"),
            ("c", "paid", None, "new"),
        ):
            cur.execute(
                "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, "
                "created_at, wait_since, waiter) values (:id, :l, 's', 100, 0, :st, 1, 0, 0, :t, :t, :w)",
                {"id": jid, "l": lane, "st": state, "t": clock.t, "w": waiter},
            )

    db.transaction(seed)
    db.close()

    def gated(led, lane):
        sql = admission.WAITERS_HEAD_SQLITE if led.db.dialect == "sqlite" else admission.WAITERS_HEAD_SQL
        return bool(led.db.transaction(lambda cur: cur.all(sql, {"l": lane, "k": 1, "f": False, "t": True})))

    def indexes(led) -> set[str]:
        sql = (
            "select name from sqlite_master where type = 'index' and tbl_name = 'job'"
            if led.db.dialect == "sqlite"
            else "select indexname from pg_indexes where tablename = 'job' and schemaname = current_schema()"
        )
        return {r[0] for r in led.rows(sql)[1]}

    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        assert "ix_job_gated" in indexes(led)
        assert (gated(led, "free"), gated(led, "paid")) == (True, False)
    finally:
        led.close()
    _downgrade(ledger_url, "0012")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0012"
    finally:
        probe.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        led.db._checked = True  # look at 0012 before the first use upgrades it
        assert "ix_job_gated" not in indexes(led)
        led.db._checked = False
        assert led.upgrade() == HEAD_REVISION
        assert "ix_job_gated" in indexes(led)
    finally:
        led.close()


def test_0014_gives_every_job_of_before_the_default_tenant_and_downgrades(ledger_url, clock):
    """A ledger at 0013 with work waiting: its jobs are tenant 'default' (no row yet: weight 1, no budget),
    admission leases them as before, and new tenants share the lane; the downgrade drops it all."""

    db = _database_at(ledger_url, "0013")
    db.transaction(
        lambda cur: cur.execute(
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, created_at, "
            "wait_since) values ('old', 'free', 's', 100, 0, 'new', 1, 0, 0, :t, :t)",
            {"t": clock.t},
        )
    )
    db.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        assert led.job("old")["tenant"] == "default"
        assert [(t["tenant"], t["spent"]) for t in led.tenants("free")] == [("default", 0)]
        new = led.submit("s", 100, "free", tenant="team-a")
        assert {x.job_id for x in led.tick("free")} == {"old", new}
        assert [t["tenant"] for t in led.tenants("free")] == ["default", "team-a"]
        assert led.audit() == []
    finally:
        led.close()
    _downgrade(ledger_url, "0013")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0013"
    finally:
        probe.close()


def test_0018_counts_a_lane_with_rule_12_on_as_on_since_long_ago_and_downgrades(ledger_url, clock):
    """A ledger at 0017 with rule 12 on in lane free: after the upgrade free counts as on since a day before (its next
    refit may learn Q, as before), paid (off) has no date, a lane turned on now learns from now; down to 0017 again."""
    import time

    db = _database_at(ledger_url, "0017")
    db.transaction(lambda cur: cur.execute("update lane set overtake_slack = 1.25 where name = 'free'"))
    db.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        since = led.lane("free").overtake_since
        assert since is not None and abs(since - (time.time() - 86_400.0)) < 120, since
        assert led.set_lane("paid", overtake_slack="off").overtake_since is None
        assert led.set_lane("paid", overtake_slack=1.5).overtake_since == clock.t
        assert led.audit() == []
    finally:
        led.close()
    _downgrade(ledger_url, "0017")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0017"
    finally:
        probe.close()


def test_0019_numbers_the_waiting_jobs_again_with_rooms_per_tenant_and_downgrades(ledger_url, clock):
    """A ledger at 0018 with rule 12 on in lane free and a job numbered there (its room kept lane-wide): after the
    upgrade it waits to be numbered again (-1), the lane-wide counters are gone, and the next tick numbers it into
    its tenant's epoch and leases it; the downgrade numbers the waiting ones again under the lane-wide key."""

    db = _database_at(ledger_url, "0018")

    def seed(cur):
        cur.execute("update lane set overtake_slack = 1.25, overtake_q = 0, overtake_since = 0 where name = 'free'")
        cur.execute(
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, created_at, "
            "wait_since, tenant, arrival_pos, arrival_epoch, overtake_key, overtake_base, arrival_v) "
            "values ('old', 'free', 's', 100, 0, 'new', 1, 0, 0, :t, :t, 'team-a', 7, 0, 50, 40, 200)",
            {"t": clock.t},
        )
        cur.execute("insert into lane_epoch (lane, epoch, passed) values ('free', 0, 30)")

    db.transaction(seed)
    db.close()
    row = "select arrival_pos, arrival_epoch, overtake_base from job where id = 'old'"
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        assert led.rows(row)[1] == [(-1, None, None)]
        assert led.rows("select count(*) from lane_epoch")[1] == [(0,)]
        waiting = led.submit("s", 100, "free", tenant="team-b")
        clock.t += 1.0
        leased = {x.job_id for x in led.tick("free")}
        assert leased == {"old", waiting}
        assert led.audit() == []
        queued = led.submit("s", 100, "free", tenant="team-a")
        led.set_lane("free", max_leased=2)  # (two leased: the next one waits)
        clock.t += 1.0
        assert led.tick("free") == []
        tenants = led.rows("select tenant, epoch from lane_epoch where lane = 'free'")[1]
        assert [t for t, _ in tenants] == ["team-a"], tenants
    finally:
        led.close()
    _downgrade(ledger_url, "0018")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0018"
        found = probe.transaction(lambda cur: cur.all(f"select arrival_pos from job where id = '{queued}'"))
        assert found == [(-1,)]
    finally:
        probe.close()


def test_0020_turns_rule_12_on_for_every_lane_with_it_off_learning_from_its_next_refit_and_downgrades(
    ledger_url, clock
):
    """A ledger at 0019: free has rule 12 on with a Q learned, paid has it off and a job waiting. After the upgrade
    free is as it was; paid has the default slack, no Q and no date, and its next refit starts its learning day by
    the ledger's clock (not the migrating host's); its waiting job is leased (numbered by that refit's sweep); a
    lane created later learns from its creation; down to 0019 a lane still learning at the default is off again (its
    waiting jobs unnumbered), one with a Q keeps the rule."""
    from lane_plugin.policy import LANE_DEFAULTS

    db = _database_at(ledger_url, "0019")

    def seed(cur):
        cur.execute(
            "update lane set overtake_slack = 1.5, overtake_q = 7000, overtake_since = 100.0 where name = 'free'"
        )
        cur.execute(
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, created_at, "
            "wait_since) values ('old', 'paid', 's', 100, 0, 'new', 1, 0, 0, :t, :t)",
            {"t": clock.t},
        )

    db.transaction(seed)
    db.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        free, paid = led.lane("free"), led.lane("paid")
        assert (free.overtake_slack, free.overtake_q, free.overtake_since) == (1.5, 7000, 100.0)
        assert (paid.overtake_slack, paid.overtake_q, paid.overtake_since) == (
            LANE_DEFAULTS["overtake_slack"],
            None,
            None,
        )
        led.refit_runs("paid")
        assert led.lane("paid").overtake_since == clock.t  # the ledger's clock
        new = led.set_lane("new", ceiling=1_000, allowance=2_000)
        assert (new.overtake_slack, new.overtake_since) == (LANE_DEFAULTS["overtake_slack"], clock.t)
        assert [x.job_id for x in led.tick("paid")] == ["old"]
        assert led.audit() == []
    finally:
        led.close()
    led = Ledger(ledger_url, clock=clock)
    try:
        led.set_lane("paid", stopped=True)  # (it leases nothing: the job waits)
        waiting = led.submit("s", 100, "paid")
        led.tick("paid")  # numbers it (the learning day)
        assert led.rows(f"select arrival_pos from job where id = '{waiting}'")[1] == [(2,)]
    finally:
        led.close()
    _downgrade(ledger_url, "0019")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0019"
        lanes = "select name, overtake_slack, overtake_q from lane where name in ('free', 'paid') order by name"
        assert probe.transaction(lambda cur: cur.all(lanes)) == [("free", 1.5, 7000), ("paid", None, None)]
        job = f"select arrival_pos from job where id = '{waiting}'"
        assert probe.transaction(lambda cur: cur.all(job)) == [(None,)]
    finally:
        probe.close()


def test_0021_reads_rule_12s_rooms_and_arrivals_by_their_own_index_heads_and_downgrades(ledger_url, clock):
    """A ledger at 0020 with 3,000 waiting jobs numbered into the epochs of 30 tenants and 50 waiting to be numbered,
    never analysed (a new deployment's first minutes). After the upgrade an epoch's least room is read by the head of
    ix_job_rooms (which only it can serve now: on a table filled by ticks, before its first ANALYZE, PostgreSQL's
    planner read each epoch by ix_job_tenant_arrival's range over every waiting job of the tenant, 54.8 ms a tick for
    70 epochs of 3,500 jobs against 0.6 ms by the heads: benchmarks/bench_tenant_tick.py), and the jobs to number by
    ix_job_pending (before: a scan of the lane's waiting jobs). Down to 0020 the index holds the jobs to number again
    and ix_job_pending is gone; the ledger admits and audits sound at head."""
    from lane_plugin.ledger import queries

    db = _database_at(ledger_url, "0020")

    def seed(cur):
        cur.execute("update lane set overtake_slack = 1.25, overtake_q = 100000, overtake_since = 1.0")
        cur.execute(
            "with recursive g(n) as (select 1 union all select n + 1 from g where n < 3050) "
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, created_at, "
            "wait_since, tenant, arrival_pos, arrival_epoch, overtake_key, overtake_base, arrival_v) "
            "select 'j' || n, 'free', 's', 100, 0, 'new', 1, 0, 0, :t, :t + n, 't' || (n % 30), "
            "case when n <= 3000 then n else -1 end, case when n <= 3000 then n / 64 end, "
            "case when n <= 3000 then 10000 end, case when n <= 3000 then 10000 end, "
            "case when n <= 3000 then 100 * n end from g",
            {"t": clock.t},
        )
        cur.execute(
            "insert into lane_epoch (lane, tenant, epoch, passed) select distinct lane, tenant, arrival_epoch, 0 "
            "from job where arrival_epoch is not null"
        )
        cur.execute("update lane set arrivals = 3000 where name = 'free'")

    db.transaction(seed)
    db.close()
    pg = ledger_url.startswith("postgresql")

    def plan(sql: str, params: dict) -> str:
        for name, value in sorted(params.items(), key=lambda kv: -len(kv[0])):
            sql = sql.replace(f":{name}", repr(value))
        explain = "explain " if pg else "explain query plan "
        _, rows = led.rows(explain + sql)
        return "\n".join(str(r[-1]) for r in rows)

    led = Ledger(ledger_url, clock=clock)
    try:
        assert led.upgrade() == HEAD_REVISION
        epochs = plan(queries.overtake_epochs(1), {"l": "free", "t0": "t7"})
        assert "ix_job_rooms" in epochs and "ix_job_tenant_arrival" not in epochs, epochs
        pending = plan(queries.OVERTAKE_PENDING, {"l": "free", "k": 512})
        assert "ix_job_pending" in pending, pending
        clock.t += 10_000.0
        assert len(led.tick("free")) == led.lane("free").max_leased
        assert led.audit() == []
    finally:
        led.close()
    _downgrade(ledger_url, "0020")
    probe = _database_at(ledger_url)
    try:
        assert probe.revision() == "0020"
        where = "pg_indexes where schemaname = current_schema() and indexname" if pg else "sqlite_master where name"
        column = "indexdef" if pg else "sql"
        defs = probe.transaction(
            lambda cur: cur.all(f"select {column} from {where} in ('ix_job_tenant_arrival', 'ix_job_pending')")
        )
        assert len(defs) == 1 and "arrival_pos is not null" in defs[0][0].lower(), defs
    finally:
        probe.close()

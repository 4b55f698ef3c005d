"""Issue 14: a ``leased`` NOTIFY names the jobs leased, so only the process waiting for them reads.

With a thousand waiters in several processes, every hand-off used to make every process's watcher
read all its waiting rows. The payload now carries the leased job ids (``<schema>|<lane>|leased:<id>,...``):
a watcher holding none of them does no SQL, the one holding them reads only their rows. A payload
that names no jobs (past PostgreSQL's 8000-byte limit, or an older version's plain ``leased``) makes
every watcher read all its waiting rows, as before; a NOTIFY lost altogether is caught by the safety poll.
"""

from __future__ import annotations

import time

import pytest

from lane_plugin import Ledger
from lane_plugin.ledger import waiters, wakeups
from lane_plugin.ledger.url import parse_url


def lane(led, name="h", **kw):
    settings = dict(
        allowance=100_000,
        ceiling=100_000,
        start_fraction=1.0,
        burst_tokens=100_000,
        max_leased=2,
        lease_seconds=30,
        max_attempts=3,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane(name, **settings)


# -- the payload -----------------------------------------------------------------------------------
def test_the_payload_names_the_jobs_and_parses_back():
    what = waiters.leased_what("h|x", ["a1", "b2"])
    assert what == "leased:a1,b2"
    assert waiters.parse_what(f"h|x|{what}") == ("h|x", "leased", frozenset({"a1", "b2"}))
    assert waiters.parse_what("h|x|leased") == ("h|x", "leased", None)  # an older version's payload
    assert waiters.parse_what("h|room") == ("h", "room", None)


def test_a_list_past_the_payload_limit_or_an_id_with_a_separator_names_no_jobs():
    ids = [f"{k:032x}" for k in range(400)]  # 33 bytes each: 13,200 bytes
    assert waiters.leased_what("h", ids) == "leased"
    assert waiters.leased_what("h", ["a,b", "c"]) == "leased"
    assert waiters.leased_what("h", ["a|b"]) == "leased"
    assert waiters.leased_what("h", []) == "leased"


def longest(lane_name: str) -> tuple[int, str]:
    """The most 32-character ids ``leased_what`` still names for ``lane_name``, and that payload's ``what``."""
    n = 1
    while waiters.leased_what(lane_name, [f"{k:032x}" for k in range(n + 1)]) != "leased":
        n += 1
    return n, waiters.leased_what(lane_name, [f"{k:032x}" for k in range(n)])


def test_the_longest_payload_named_fits_postgresqls_limit_with_the_longest_schema_name(pg_url):
    import psycopg

    with psycopg.connect(**parse_url(pg_url).conninfo, autocommit=True) as conn:
        send = "select pg_notify('lane_plugin_test', %s)"
        conn.execute(send, ("x" * (waiters.NOTIFY_BYTES - 1),))  # the limit is what PostgreSQL says it is
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute(send, ("x" * waiters.NOTIFY_BYTES,))
    for name in ("h", "lane-€uro-" * 20):  # bytes, not characters
        n, what = longest(name)
        assert n > 50, "a hand-off of a whole lane's slots must fit"
        payload = "s" * 63 + "|" + name + "|" + what  # 63: the longest schema name PostgreSQL allows
        with psycopg.connect(**parse_url(pg_url).conninfo, autocommit=True) as conn:
            conn.execute("select pg_notify('lane_plugin_test', %s)", (payload,))
        assert len(payload.encode()) > waiters.NOTIFY_BYTES - 40, "the limit is used, not wasted"


# -- the watcher ------------------------------------------------------------------------------------
@pytest.fixture
def reads(monkeypatch):
    """The job ids of every read the watcher's listening connection makes (``waiters.rows_sent``)."""
    got: list[list[str]] = []
    real = waiters.rows_sent

    def spy(cur, job_ids, *args, **kw):
        got.append(sorted(job_ids))
        return real(cur, job_ids, *args, **kw)

    monkeypatch.setattr(waiters, "rows_sent", spy)
    return got


@pytest.fixture
def three(pg_url, monkeypatch, request):
    """Ledger ``a`` waits for three gated jobs in lane h; ``b`` (another process's ledger) holds both its
    slots, so the watcher's own first look (it reads and ticks at connect) leases none of them. Its safety
    poll: every 60 s unless the test says otherwise (``indirect``)."""
    monkeypatch.setattr(wakeups, "SAFETY_SECONDS", getattr(request, "param", 60.0))
    a, b = Ledger(pg_url), Ledger(pg_url)
    lane(a)
    lane(a, "o")
    for _ in range(2):
        b.submit("s", 100, "h")
    held = b.tick("h")
    assert len(held) == 2
    me = waiters.waiter_id()  # the watcher beats this waiter's heartbeat: never gone
    ids = [a.submit("s", 100, "h", waiter=me) for _ in range(3)]
    ws = {j: a.wakeups.register(j, "h") for j in ids}
    time.sleep(0.4)  # the watcher is listening (its first look, at connect, read all three and ticked h)
    assert not any(w.event.is_set() for w in ws.values())
    try:
        yield a, b, ws, held
    finally:  # a failed test's watcher must not go on reading into the next test's spy
        for j in ws:
            a.wakeups.unregister(j)
        a.close()
        b.close()


def wait_for(ws, leased, timeout=5.0) -> None:
    end = time.monotonic() + timeout
    while not all(ws[j].event.is_set() for j in leased) and time.monotonic() < end:
        time.sleep(0.01)


def test_a_payload_with_ids_wakes_exactly_those_waiters_and_reads_only_their_rows(three, monkeypatch, reads):
    a, b, ws, held = three
    reads.clear()
    other = b.submit("s", 100, "o")  # another process's own job, leased by its own tick: nobody here waits for it
    assert [x.job_id for x in b.tick("o")] == [other]
    time.sleep(0.4)
    assert reads == [], "a NOTIFY naming none of this process's jobs costs it no read"
    lane(b, max_leased=4)  # room for two of them: this tick leases two in one transaction
    leased = sorted(x.job_id for x in b.tick("h"))
    assert len(leased) == 2
    wait_for(ws, leased)
    time.sleep(0.2)
    assert reads == [leased], "only the leased jobs' rows are read, in one statement"
    assert {j for j, w in ws.items() if w.event.is_set()} == set(leased)
    for j in leased:
        assert ws[j].sent and ws[j].row[waiters.ROW_KEYS.index("state")] == "leased"
        a.settle(a.take(ws[j].row, sent=True), 100)
    for x in held:
        b.settle(x, 100)
    assert a.audit() == []


def test_a_payload_past_the_limit_names_no_jobs_and_every_watcher_reads_all_its_waiting_rows(three, monkeypatch, reads):
    monkeypatch.setattr(waiters, "NOTIFY_BYTES", 100)  # two ids no longer fit
    a, b, ws, held = three
    reads.clear()
    lane(b, max_leased=4)  # room for two of them: this tick leases two in one transaction
    leased = sorted(x.job_id for x in b.tick("h"))
    assert len(leased) == 2
    wait_for(ws, leased)
    time.sleep(0.2)
    assert reads == [sorted(ws)], "the old behaviour: all its waiting rows, in one statement"
    assert {j for j, w in ws.items() if w.event.is_set()} == set(leased)


@pytest.mark.parametrize("three", [0.5], indirect=True)
def test_a_lost_notify_is_caught_by_the_safety_poll(three, monkeypatch, reads):
    def deaf(self, timeout):  # every notification is lost
        time.sleep(timeout)
        return set()

    monkeypatch.setattr(wakeups._Listener, "wait", deaf)
    a, b, ws, held = three
    time.sleep(0.1)
    b.settle(held[0], 100)  # hands its slot to one of a's jobs; the lane stays full, so a's own ticks lease none
    [leased] = [j for j in ws if a.job(j)["state"] == "leased"]
    t0 = time.monotonic()
    wait_for(ws, [leased], timeout=5.0)
    took = time.monotonic() - t0
    assert ws[leased].event.is_set(), "a waiter whose NOTIFY was lost was never woken"
    assert took < 2.0, f"woken {took:.2f}s after its lease: not by the {wakeups.SAFETY_SECONDS}s safety poll"
    assert {j for j, w in ws.items() if w.event.is_set()} == {leased}
    assert ws[leased].sent, "woken by the watcher's read of its row (which stamped its rate charge)"
    a.settle(a.take(ws[leased].row, sent=True), 100)
    b.settle(held[1], 100)

"""Rule 12 in the ledger (lane setting ``overtake_slack``, lane_plugin.ledger.overtake), on SQLite and PostgreSQL.

The oracle is the rule's own quantity, counted from outside: for every numbered job K, the rate tokens of jobs of
its tenant that arrived after it (a higher position) and were leased while K waited. It never passes K's key.
"""

import random

import pytest

from lane_plugin.errors import InvalidInput
from lane_plugin.ledger import overtake
from lane_plugin.ledger.overtake import EPOCH
from lane_plugin.policy.slack import slack_key


def _lane(led, **settings):
    """Lane ``free`` with these settings, the rule off unless set, or turned on now; with the rule on, ``Q``
    seeded 0 unless given (the pointwise keys bind from the first arrival instead of after the learning day: these
    tests are of the rule binding)."""
    settings.setdefault("overtake_slack", None)
    if settings.get("overtake_slack") is not None:
        settings.setdefault("overtake_q", 0)
        led.set_lane("free", overtake_slack=None)  # (on by default: turned on now, its learning day starts now)
    return led.set_lane(
        "free",
        **{
            "allowance": 10**12,
            "ceiling": 10**12,
            "burst_tokens": 100_000,
            "window_seconds": 1.0,
            "max_leased": 2,
            "max_wait_seconds": 3_600.0,
            **settings,
        },
    )


def _numbers(led, lane="free") -> dict[str, tuple]:
    """Every job's ``(arrival_pos, overtake_key, arrival_v, overtake_base)`` as the ledger holds them."""
    sql = "select id, arrival_pos, overtake_key, arrival_v, overtake_base from job where lane = :l"
    rows = led._run(lambda cur, now: cur.all(sql, {"l": lane}), write=False)
    return {r[0]: tuple(r[1:]) for r in rows}


class Passes:
    """What passed each waiting job, counted from the leases in the order the ledger granted them: the leases of
    its own tenant (``across``: of any tenant, what a lane-wide count would charge).

    A job is numbered by the first tick after it entered; the leases of a tick are read against the places the
    tick gave (every job waiting then had one), one by one in the tick's order."""

    def __init__(self, across: bool = False):
        self.waiting: set[str] = set()
        self.passed: dict[str, int] = {}
        self.rate: dict[str, int] = {}
        self.tenant: dict[str, str] = {}
        self.across = across

    def arrived(self, job_id: str, rate: int, tenant: str = "default") -> None:
        self.waiting.add(job_id)
        self.passed[job_id], self.rate[job_id], self.tenant[job_id] = 0, rate, tenant

    def ticked(self, led, leases) -> None:
        numbers = _numbers(led)
        for lease in leases:
            self.waiting.discard(lease.job_id)
            pos = numbers[lease.job_id][0]
            assert pos is not None and pos > 0, "a tick numbers every job waiting before it admits"
            mine = self.tenant[lease.job_id]
            for k in self.waiting:
                pk = numbers[k][0]
                if pk is not None and 0 < pk < pos and (self.across or self.tenant[k] == mine):
                    self.passed[k] += self.rate[lease.job_id]

    def over(self, numbers: dict[str, tuple]) -> list[tuple[str, int, int]]:
        """The jobs passed by more than their key: ``(id, passed, key)``."""
        return [(j, o, numbers[j][1]) for j, o in self.passed.items() if o > numbers[j][1]]


def _big_amid_small(led, clock, passes=None, smalls=60):
    """5 small jobs, one of 20,000 tokens, then ``smalls`` more small ones, one a second; two lease slots, each
    lease settled at once: the order places the big job ``20,000 x 3,600 / 100,000 = 720`` s late (a small one 36 s),
    so every small job arriving in that span goes first unless the rule stops it. Returns ``(big id, lease order)``."""
    ids = []
    for i in range(5 + 1 + smalls):
        clock.t += 1.0
        est = 20_000 if i == 5 else 1_000
        ids.append(led.submit("s", est, "free"))
        if passes is not None:
            passes.arrived(ids[-1], est)
    return ids[5], _drain(led, clock, *([passes] if passes is not None else []))


def _drain(led, clock, *passes: Passes) -> list[str]:
    """Tick lane ``free`` a second apart until a tick leases nothing, settling each lease at its estimate; each of
    ``passes`` counts what every tick's leases passed. Returns the job ids in lease order."""
    order = []
    for _ in range(200):
        clock.t += 1.0
        leases = led.tick("free")
        if not leases:
            break
        for p in passes:
            p.ticked(led, leases)
        for lease in leases:
            order.append(lease.job_id)
            led.settle(lease, lease.est)
    return order


def test_no_job_is_passed_by_more_than_its_key(led, clock):
    """The big job found 5,000 rate tokens waiting: with slack 1.25 and nothing learned its key is 1,250, so at
    most one small job passes it; with the rule off the order lets far more by."""
    _lane(led, overtake_slack=1.25)
    passes = Passes()
    big, order = _big_amid_small(led, clock, passes)
    numbers = _numbers(led)
    assert numbers[big][1] == slack_key(5_000, 0, 1.25) == 1_250
    assert passes.over(numbers) == []
    assert passes.passed[big] <= 1_250 and order.index(big) <= 6, order.index(big)
    assert len(order) == 66 and led.audit() == []


def test_without_the_rule_the_same_traffic_passes_the_big_job(led, clock):
    """The control: the same traffic with the rule off, the big job's key computed the same way is passed."""
    _lane(led)
    big, order = _big_amid_small(led, clock)
    assert _numbers(led)[big][0] is None  # off: nothing is numbered
    passed_big = 1_000 * sum(1 for j in order[: order.index(big)] if order.index(j) >= 5)
    assert passed_big > slack_key(5_000, 0, 1.25) and order.index(big) > 20, order.index(big)


def test_a_job_is_charged_only_for_its_own_tenants_passes(led, clock):
    """Tenant a's big job (key 1,250) amid small jobs of a and of b: a's younger jobs pass it by at most its key,
    b's go in the fair order whatever its room (the rooms are per tenant); counted lane-wide, b's passes alone are
    many times its key, which a lane-wide rule would have refused (it held the fair share, docs/admission.md)."""
    _lane(led, overtake_slack=1.25)
    led.set_tenant("free", "b", weight=1)
    mine, across = Passes(), Passes(across=True)
    jobs = [("a", 1_000)] * 5 + [("a", 20_000)] + [(t, 1_000) for _ in range(30) for t in ("a", "b")]
    for tenant, est in jobs:
        clock.t += 1.0
        jid = led.submit("s", est, "free", tenant=tenant)
        mine.arrived(jid, est, tenant)
        across.arrived(jid, est, tenant)
        if est == 20_000:
            big = jid
    order = _drain(led, clock, mine, across)
    numbers = _numbers(led)
    assert numbers[big][1] == 1_250 and mine.over(numbers) == []
    assert mine.passed[big] <= 1_250 and across.passed[big] >= 10 * 1_250, (mine.passed[big], across.passed[big])
    assert len(order) == len(jobs) and led.audit() == []


@pytest.mark.parametrize("epoch", [4, EPOCH])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_traffic_with_tenants_keeps_every_key(led, clock, seed, epoch, monkeypatch):
    """Random sizes (a heavy tail), two tenants of weights 1 and 3, arrivals between ticks, settlements early
    or late, over 200 arrivals: with epochs of 4 (fifty of them: whole epochs, partial ones, emptied ones) and of
    the ledger's size, no numbered job is ever passed by more than its key."""
    monkeypatch.setattr(overtake, "EPOCH", epoch)
    rng = random.Random(seed)
    _lane(led, overtake_slack=1.3, max_leased=3)
    led.set_tenant("free", "big", weight=3)
    passes, held, n, turns = Passes(), [], 0, 0
    while n < 200 or passes.waiting or held:
        turns += 1
        assert turns < 20_000, "the lane stopped admitting"
        clock.t += rng.random()
        if n < 200 and rng.random() < 0.6:
            est = min(50_000, int(rng.lognormvariate(7, 1.2)) + 1)
            tenant = rng.choice(["big", "small"])
            jid = led.submit("s", est, "free", tenant=tenant)
            passes.arrived(jid, est, tenant)
            n += 1
            continue
        leases = led.tick("free")
        passes.ticked(led, leases)
        held += leases
        rng.shuffle(held)
        while held and rng.random() < 0.7:
            lease = held.pop()
            led.settle(lease, lease.est)
    numbers = _numbers(led)
    assert passes.over(numbers) == []
    assert sum(1 for o in passes.passed.values() if o > 0) > 10  # the order did pass jobs: the rule had work
    assert max(pos for pos, *_ in numbers.values()) == 200  # numbered from 1: 200 // epoch + 1 epochs spanned
    assert led.audit() == []


def test_a_job_entering_again_is_numbered_afresh_by_the_next_tick(led, clock):
    """A retry reopens a job: its old place would be read against counters that moved on, so it waits to be
    numbered (-1) and the next tick numbers it as a new arrival, behind the jobs already waiting."""
    _lane(led, overtake_slack=1.25, max_leased=1)
    a = led.submit("s", 1_000, "free", key="a")
    clock.t += 1.0  # (jobs entering at the same instant are numbered in id order)
    b = led.submit("s", 1_000, "free", key="b")
    assert _numbers(led)[a][0] == _numbers(led)[b][0] == -1  # numbered by the lane's next tick
    (lease,) = led.tick("free")
    assert lease.job_id == a and _numbers(led)[b][:2] == (2, slack_key(1_000, 0, 1.25))
    led.settle(lease, 0, outcome="failed")
    led.submit("s", 1_000, "free", key="a", attempt=2)  # the retry
    assert _numbers(led)[a][0] == -1
    assert [x.job_id for x in led.tick("free")] == [b]
    assert _numbers(led)[a][:3] == (3, slack_key(1_000, 0, 1.25), 1_000)  # it found b's 1,000 waiting
    assert led.audit() == []


def test_changing_the_slack_numbers_the_waiting_jobs_afresh(led, clock):
    """Rooms counted under one slack (or while the rule was off) are not another's: a change forgets them, and
    with the rule on the next tick numbers the waiting jobs again in the order they entered."""
    _lane(led, max_leased=1)
    jobs = []
    for _ in range(3):
        clock.t += 1.0
        jobs.append(led.submit("s", 1_000, "free"))
    assert all(_numbers(led)[j][0] is None for j in jobs)  # off: nothing is numbered
    led.set_lane("free", overtake_slack=1.25, overtake_q=0)  # on: the waiting jobs are numbered by the next tick
    (lease,) = led.tick("free")
    assert [_numbers(led)[j][0] for j in jobs] == [1, 2, 3] and lease.job_id == jobs[0]
    led.set_lane("free", overtake_slack=1.5)
    assert [_numbers(led)[j][0] for j in jobs[1:]] == [-1, -1]
    led.tick("free")
    assert [_numbers(led)[j][:2] for j in jobs[2:]] == [(5, slack_key(1_000, 0, 1.5))]  # the counter goes on
    led.set_lane("free", overtake_slack="off")
    assert led.set_lane("free").overtake_slack is None
    off = led.submit("s", 1_000, "free")
    assert _numbers(led)[jobs[2]][0] is None and _numbers(led)[off][0] is None


def test_a_lane_with_the_rule_on_and_no_date_starts_its_learning_day_at_its_next_refit(led, clock):
    """A row with the rule on and no ``overtake_since`` (written by hand, or by a migration whose host clock is not
    the ledger's) does not bind at once on a day of arrivals it never learned from: its next refit starts the day,
    by the ledger's clock, and a day later the refit learns Q."""
    _lane(led, overtake_slack=1.25, overtake_q=None, max_leased=1)
    led.db.transaction(lambda cur: cur.execute("update lane set overtake_since = null where name = 'free'"))
    for _ in range(250):
        clock.t += 1.0
        led.submit("s", 100, "free")
    clock.t += 2 * overtake.LEARN_SECONDS
    led.refit_runs("free")
    assert (led.lane("free").overtake_since, led.lane("free").overtake_q) == (clock.t, None)
    clock.t += overtake.LEARN_SECONDS - 400.0  # late in its day: 250 arrivals, numbered by a tick
    for _ in range(250):
        clock.t += 1.0
        led.submit("s", 100, "free")
    led.tick("free")
    clock.t += 150.0
    led.refit_runs("free")
    assert led.lane("free").overtake_q is not None  # the day is over
    assert led.audit() == []


def test_the_refit_learns_the_p99_of_what_arrivals_found_waiting(led, clock):
    """A day after the rule was turned on, 250 arrivals later (the warm-up is 200), the refit writes Q, the p99 of V,
    over the seeded one, and the next key reads it."""
    _lane(led, overtake_slack=1.25, max_leased=1)
    clock.t += overtake.LEARN_SECONDS
    for _ in range(250):
        clock.t += 1.0
        led.submit("s", 100, "free")
    led.tick("free")  # numbers all 250, leases the first
    vs = sorted(v for _, _, v, _ in _numbers(led).values())
    assert vs == [100 * i for i in range(250)]
    led.refit_runs("free")
    q = led.set_lane("free").overtake_q
    assert q == vs[int(0.99 * 250)] == 24_700
    new = led.submit("s", 100, "free")
    led.tick("free")  # needs the first settled: numbers the new one only
    assert _numbers(led)[new][1] == slack_key(24_900, q, 1.25) == 6_225


def test_the_audit_names_a_job_passed_past_its_key(led, clock):
    """I7: the audit reads each numbered waiting job's room; a room written below zero (what a pass the rule
    refused would leave) is named with the job and how far it was passed."""
    _lane(led, overtake_slack=1.25, max_leased=1)
    jobs = []
    for _ in range(3):
        clock.t += 1.0
        jobs.append(led.submit("s", 1_000, "free"))
    led.tick("free")  # numbers them, leases the first
    assert led.audit() == []
    sql = "update job set overtake_base = overtake_base - 2000 where id = :id"
    led._run(lambda cur, now: cur.execute(sql, {"id": jobs[2]}))
    key = _numbers(led)[jobs[2]][1]
    assert led.audit() == [f"I7 job {jobs[2]} in lane free: passed by 2000 rate tokens, more than its key {key}"]
    # An epoch on a job not numbered: the reads by epoch (which do not ask its position) would count it.
    sql = "update job set arrival_pos = -1, overtake_base = overtake_base + 2000 where id = :id"
    led._run(lambda cur, now: cur.execute(sql, {"id": jobs[2]}))
    epoch = led.rows(f"select arrival_epoch from job where id = '{jobs[2]}'")[1][0][0]
    assert led.audit() == [f"I7 job {jobs[2]} in lane free: in epoch {epoch} but not numbered (position -1)"]


@pytest.mark.parametrize("bad", [0.5, 11, float("nan"), "fast", True])
def test_a_bad_slack_is_refused_naming_it(led, bad):
    _lane(led)
    with pytest.raises(InvalidInput, match="overtake_slack"):
        led.set_lane("free", overtake_slack=bad)
    assert led.set_lane("free").overtake_slack is None


def test_concurrent_intake_and_admission_number_every_arrival_once(ledger_url):
    """Four threads, each its own Ledger (its own connections), submitting random sizes and ticking and settling
    at once: the lane lock serialises numbering with admission, so the positions are exactly 1..N, every job found
    a backlog no larger than all the others' rate tokens, and the audit (I7 included: no waiting job's room below
    zero) is clean whenever a thread looks, and at the end."""
    import threading

    from lane_plugin import Ledger

    setup = Ledger(ledger_url)
    _lane(setup, overtake_slack=1.25, max_leased=3, window_seconds=0.05)
    errors: list[BaseException] = []
    audits: list[list[str]] = []

    def worker(seed: int) -> None:
        rng, led = random.Random(seed), Ledger(ledger_url)
        try:
            for i in range(40):
                led.submit("s", rng.randint(100, 5_000), "free", tenant=rng.choice(["a", "b"]))
                for lease in led.tick("free"):
                    led.settle(lease, lease.est)
                if i % 10 == 9:
                    audits.append(led.audit())
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)
        finally:
            led.close()

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    try:
        assert not errors, errors
        assert len(audits) == 16 and all(a == [] for a in audits), audits
        for _ in range(500):
            leases = setup.tick("free")
            if not leases and not setup.lane("free").leased:
                break
            for lease in leases:
                setup.settle(lease, lease.est)
        numbers = _numbers(setup)
        assert sorted(pos for pos, *_ in numbers.values()) == list(range(1, 161))
        rates = {j: r for j, r in setup._run(lambda cur, now: cur.all("select id, rate_cost from job"), write=False)}
        assert all(0 <= v <= sum(rates.values()) - rates[j] for j, (_, _, v, _) in numbers.items())
        assert setup.lane("free").leased == 0 and setup.audit() == []
    finally:
        setup.close()


def test_a_burst_is_numbered_a_few_hundred_a_tick_oldest_first(led, clock, monkeypatch):
    """A tick numbers at most NUMBER_PER_TICK arrivals (here 4), oldest first: the rest keep no place until a later
    tick and are not leased before it; every job is numbered once, in the order it entered, and leased in the end."""
    monkeypatch.setattr(overtake, "NUMBER_PER_TICK", 4)
    _lane(led, overtake_slack=1.25, max_leased=2)
    jobs = []
    for _ in range(10):
        clock.t += 1.0
        jobs.append(led.submit("s", 1_000, "free"))
    first = led.tick("free")
    assert [_numbers(led)[j][0] for j in jobs] == [1, 2, 3, 4] + [-1] * 6
    assert {x.job_id for x in first} <= set(jobs[:4])
    leased = list(first)
    for _ in range(20):
        for lease in leased[-2:]:
            led.settle(lease, lease.est)
        clock.t += 1.0
        leased += led.tick("free")
    assert [_numbers(led)[j][0] for j in jobs] == list(range(1, 11))
    assert sorted(x.job_id for x in leased) == sorted(jobs) and led.audit() == []


def test_the_rule_holds_nobody_back_until_it_has_learned_a_day_then_binds(led, clock):
    """Turned on without a seed, the rule numbers arrivals and keeps their V but holds nobody back: the big job amid
    small ones is passed as with the rule off, and ``lane status`` says it is learning. A day later the refit learns
    Q from the day's arrivals (here each found nothing waiting: Q = 0) and the same traffic is held to the keys."""
    _lane(led, overtake_slack=1.25, overtake_q=None)
    t0 = clock.t
    [s] = [s for s in led.lanes() if s["lane"] == "free"]
    assert (s["overtake_slack"], s["overtake_q"], s["overtake_since"]) == (1.25, None, t0)
    big, order = _big_amid_small(led, clock, smalls=200)  # (past the refit's warm-up of 200 arrivals)
    assert order.index(big) > 20, order.index(big)  # passed as with the rule off
    assert {k for _, k, _, _ in _numbers(led).values()} == {overtake.UNBOUNDED}  # numbered, unbounded
    led.refit_runs("free")
    assert led.lane("free").overtake_q is None  # not a day yet: nothing learned
    clock.t = t0 + overtake.LEARN_SECONDS - 1_000.0
    for _ in range(250):  # the day's arrivals, each alone in the queue
        clock.t += 1.0
        led.submit("s", 1_000, "free")
        for lease in led.tick("free"):
            led.settle(lease, lease.est)
    clock.t = t0 + overtake.LEARN_SECONDS + 500.0  # the first traffic is out of the last day
    led.refit_runs("free")
    assert led.lane("free").overtake_q == 0
    big, order = _big_amid_small(led, clock)
    assert _numbers(led)[big][1] == slack_key(5_000, 0, 1.25) == 1_250
    assert order.index(big) <= 6, order.index(big)  # held to its key now
    assert led.audit() == []


def test_a_seeded_q_binds_at_once_and_learn_forgets_it(led, clock):
    """``overtake_q`` seeds the p99 (a lane like it's): the keys read it from the next arrival, the waiting jobs are
    numbered afresh with it; set to None, the lane forgets it and learns a day afresh from now."""
    _lane(led, overtake_slack=1.25, overtake_q=None, max_leased=1)
    a = led.submit("s", 1_000, "free")
    led.tick("free")  # numbered (and leased)
    b = led.submit("s", 1_000, "free")
    led.tick("free")  # numbered, unbounded (the first is still leased)
    assert _numbers(led)[b][1] == overtake.UNBOUNDED
    row = led.set_lane("free", overtake_q=4_000)
    assert row.overtake_q == 4_000
    assert _numbers(led)[b][0] == overtake.PENDING  # numbered afresh by the next tick, with the seed
    led.tick("free")
    assert _numbers(led)[b][1] == slack_key(0, 4_000, 1.25) == 5_000
    clock.t += 10.0
    row = led.set_lane("free", overtake_q=None)
    assert (row.overtake_q, row.overtake_since) == (None, clock.t)
    for bad in (-1, 1.5, "many", True):
        with pytest.raises(InvalidInput, match="overtake_q"):
            led.set_lane("free", overtake_q=bad)
    assert led.job(a)["state"] == "leased"


def _learn_q_zero(led, clock, t0: float) -> None:
    """The day's arrivals, each alone in the queue, late in the day after ``t0``; then past the day, the refit."""
    clock.t = t0 + overtake.LEARN_SECONDS - 1_000.0
    for _ in range(250):
        clock.t += 1.0
        led.submit("s", 1_000, "free")
        for lease in led.tick("free"):
            led.settle(lease, lease.est)
    clock.t = t0 + overtake.LEARN_SECONDS + 10.0


def test_turned_off_and_on_again_the_rule_learns_a_day_afresh(led, clock):
    """(Outside review.) A Q learned while the rule was last on is forgotten when it is turned on again (it bound at
    once, the pointwise keys of a month ago, and the refit could not replace it for a day); a seed given in the same
    change is kept; a seed for a lane whose rule is off is refused, naming overtake_q."""
    _lane(led, overtake_slack=1.25, overtake_q=None)
    _learn_q_zero(led, clock, clock.t)
    led.refit_runs("free")
    assert led.lane("free").overtake_q == 0
    led.set_lane("free", overtake_slack="off")
    with pytest.raises(InvalidInput, match="overtake_q"):
        led.set_lane("free", overtake_q=5_000)
    clock.t += 30 * 86_400.0
    row = led.set_lane("free", overtake_slack=1.25)
    assert (row.overtake_q, row.overtake_since) == (None, clock.t)
    job = led.submit("s", 1_000, "free")
    led.tick("free")
    assert _numbers(led)[job][1] == overtake.UNBOUNDED
    led.set_lane("free", overtake_slack="off")
    row = led.set_lane("free", overtake_slack=1.25, overtake_q=5_000)
    assert row.overtake_q == 5_000


def test_jobs_waiting_when_the_learning_day_ends_are_numbered_again_with_q(led, clock):
    """(Outside review.) The refit that learns the first Q numbers the waiting jobs afresh: numbered on the learning
    day, the big job kept an unbounded key and all 60 later small jobs passed it (place 63); now it has a key."""
    _lane(led, overtake_slack=1.25, overtake_q=None)
    t0 = clock.t
    _learn_q_zero(led, clock, t0)
    clock.t = t0 + overtake.LEARN_SECONDS - 100.0  # still the learning day
    ids = []
    for i in range(6):
        clock.t += 1.0
        ids.append(led.submit("s", 20_000 if i == 5 else 1_000, "free"))
    big = ids[5]
    for lease in led.tick("free"):
        led.settle(lease, lease.est)
    assert _numbers(led)[big][1] == overtake.UNBOUNDED  # numbered while learning
    clock.t = t0 + overtake.LEARN_SECONDS + 10.0
    led.refit_runs("free")  # the day is learned
    assert led.lane("free").overtake_q is not None and _numbers(led)[big][0] == overtake.PENDING
    for _ in range(60):
        clock.t += 1.0
        led.submit("s", 1_000, "free")
    order = []
    for _ in range(200):
        clock.t += 1.0
        leases = led.tick("free")
        if not leases:
            break
        for lease in leases:
            order.append(lease.job_id)
            led.settle(lease, lease.est)
    assert order.index(big) <= 6, order.index(big)
    assert led.audit() == []

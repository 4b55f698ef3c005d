"""The simulator and the real ledger admit the same jobs in the same order.

The simulator records its event log (submit / tick / settle at simulated
times); the test replays that log against a real :class:`Ledger` on SQLite
whose clock is set to each event's time, and compares every tick's leases.
"""

from __future__ import annotations

import json
import time

import pytest
import typer
from typer.testing import CliRunner

from lane_plugin import Ledger
from lane_plugin.policy.limits import Limit
from lane_plugin.sim.command import simulate as simulate_command
from lane_plugin.sim.engine import SimConfig, simulate
from lane_plugin.sim.traffic import Trace

T0 = 1_800_000_000.0  # a multiple of the window, so windows line up


def mixed_trace(n: int = 48) -> Trace:
    """Runs of 1-3 stages, distinct estimates (no ties), some too big to start late."""
    tr = Trace()
    t = 0.0
    for i in range(n):
        t += (7 * i) % 5 + 1  # 1..5 s apart
        est = 120 + (i * 337) % 900 + i  # distinct, 120..1100
        run_key = None if i % 5 == 0 else f"r{i // 3}"
        tr.add(t, f"s{i % 3}", est, int(est * (1.1 if i % 2 else 0.8)), run_key)
    return tr.sort()


CFG = dict(
    ceiling=9_000,
    allowance=12_000,
    start_fraction=0.8,
    burst_tokens=2_500,
    window_seconds=10.0,
    max_leased=3,
    lease_seconds=100_000.0,
    max_wait_seconds=40.0,
    workers=2,
    service_base=3.0,
    service_per_token=0.01,
    period_seconds=None,
    # Rule 12 is on by default; a new lane runs its learning day (no Q yet), so the simulator runs that day too
    # (its default, the second day, would learn Q from a first replay the ledger's lane never had).
    overtake_day=1,
)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


# The third scenario runs past two refits of the finishing reserve (every 300 s) with runs lapsing
# 40 s after their last admission, and its ceiling binds after the first: starting jobs wait for
# (or are parked by) the reserve learned from the runs that finished.
RESERVE = dict(jobs=200, ceiling=80_000, start_fraction=1.0, lease_seconds=40.0, workers=4, max_leased=6)
# The fourth: the provider's limits beside the tokens window (rule 6b), both binding in turn.
LIMITS = dict(ceiling=60_000, limits=(("requests", Limit(2, 10.0)), ("input_tokens", Limit(1_500, 10.0))))
# The fifth: rule 12 (lane overtake_slack, the ledger's epochs; the simulator's exact rooms), holding back passes.
# Q seeded 0 on both sides (the pointwise keys), so the rule binds from the first arrival.
OVERTAKE = dict(ceiling=60_000, overtake_slack=1.1, overtake_exact=True, overtake_learned=0)
# The sixth: rule 12 on a lane whose finishing reserve binds: the stages of runs under way are neither held nor
# charged by it (on, a budget-bound week of such runs stalled: a run's later stage could not pass the first stages
# the reserve of its own run kept out).
RESERVE_OVERTAKE = dict(RESERVE, overtake_slack=1.1, overtake_exact=True, overtake_learned=0)


@pytest.mark.parametrize(
    "case",
    [dict(ceiling=9_000), dict(ceiling=60_000), RESERVE, LIMITS, OVERTAKE, RESERVE_OVERTAKE],
    ids=["9k", "60k", "reserve", "limits", "overtake", "reserve-overtake"],
)
def test_ledger_admits_what_the_simulator_admits(tmp_path, case, monkeypatch):
    from lane_plugin.policy.rules import OVERTAKE as OVERTAKE_RULE
    from lane_plugin.policy.rules import RESERVE as RESERVE_RULE
    from lane_plugin.sim import policies as sim_policies

    case = dict(case)
    tr = mixed_trace(case.pop("jobs", 48))
    cfg = SimConfig(**{**CFG, **case, "allowance": case["ceiling"] + 3_000})
    rules: list[str] = []
    real = sim_policies.admit

    def spy(snapshot, candidates, **kw):  # which rules kept jobs out, and whether any reserve was held
        d = real(snapshot, candidates, **kw)
        rules.extend(r for _, r, _ in d.parked)
        rules.append(f"finishing={snapshot.finishing > 0}")
        rules.append(f"overtake={d.head_reason == OVERTAKE_RULE}")
        rules.append(f"uncharged={bool(d.uncharged)}")
        return d

    monkeypatch.setattr(sim_policies, "admit", spy)
    (sim,) = simulate(tr, cfg, ["lane"], record=True)
    ticks = [e for e in sim.log if e[0] == "tick"]
    assert sum(len(e[2]) for e in ticks) >= 10  # the scenario admits enough to compare
    if cfg.lease_seconds < 1_000:
        assert "finishing=True" in rules and RESERVE_RULE in rules  # the reserve is learned and binds
    if cfg.limits:
        assert {"requests", "input_tokens"} <= set(sim.limit_held)  # each limit held the queue at some tick
    if "overtake_slack" in case:
        assert "overtake=True" in rules  # a job's room held a pass back
    else:  # the default: rule 12 on, its learning day (keys unbounded), as the ledger's new lane below
        assert cfg.overtake_slack == 1.25 and "overtake=True" not in rules
    if "overtake_slack" in case and cfg.lease_seconds < 1_000:
        assert "uncharged=True" in rules  # a stage of a run under way passed older jobs, uncharged

    clock = Clock()
    led = Ledger(f"sqlite:///{tmp_path / 'sim.db'}", clock=clock)
    try:
        led.set_lane(
            "sim",
            allowance=cfg.allowance,
            ceiling=cfg.ceiling,
            start_fraction=cfg.start_fraction,
            burst_tokens=cfg.burst_tokens,
            window_seconds=cfg.window_seconds,
            max_leased=cfg.max_leased,
            lease_seconds=cfg.lease_seconds,
            max_wait_seconds=cfg.max_wait_seconds,
            limits=[f"{unit}={lim.amount}/{lim.window_seconds:g}s" for unit, lim in cfg.limits],
            overtake_slack=cfg.overtake_slack,
            overtake_q=cfg.overtake_learned,
        )
        assert led.lane("sim").start_fraction == cfg.start_fraction
        to_ledger: dict[str, str] = {}
        to_sim: dict[str, str] = {}
        parking: list[str] = []  # the simulator parks inside a tick, and logs it before the tick
        for event in sim.log:
            kind, t = event[0], event[1]
            clock.t = T0 + t
            if kind == "submit":
                j = int(event[2][1:])
                jid = led.submit(stage=tr.stage[j], est=tr.est[j], lane="sim", run_key=tr.run_key[j])
                to_ledger[event[2]], to_sim[jid] = jid, event[2]
            elif kind == "tick":
                got = [to_sim[lease.job_id] for lease in led.tick("sim")]
                assert got == event[2], f"tick at t={t}: ledger admitted {got}, simulator {event[2]}"
                parked = [j for j in parking if led.job(to_ledger[j])["state"] == "parked"]
                assert parked == parking, f"tick at t={t}: the simulator parked {parking}, the ledger {parked}"
                parking.clear()
            elif kind == "settle":
                led.settle(to_ledger[event[2]], actual=event[3], attempt=1)
            elif kind == "park":
                parking.append(event[2])
            else:  # pragma: no cover - no lease expiry in this scenario
                pytest.fail(f"unexpected event {event}")
        assert not parking
        lane = led.lane("sim")
        assert lane.spent == sim.spent  # no period: the ledger's counter is the total
        assert lane.leased == sum(1 for e in ticks for _ in e[2]) - sim.done
    finally:
        led.close()


def test_simulate_command_reads_a_lane_and_its_history(tmp_path):
    url = f"sqlite:///{tmp_path / 'hist.db'}"
    clock = Clock()
    clock.t = time.time() - 3_600  # within --days 1 of the real clock
    led = Ledger(url, clock=clock)
    try:
        led.set_lane("free", ceiling=5_000, allowance=6_000, burst_tokens=2_000, max_leased=4)
        for i in range(6):
            clock.t += 10
            led.submit(stage="s", est=100 + i, lane="free", run_key=f"r{i}")
        for lease in led.tick("free"):
            led.settle(lease.job_id, actual=lease.est * 2, attempt=lease.attempt)
    finally:
        led.close()
    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("noop")(lambda: None)  # a group, so "simulate" is a subcommand
    res = CliRunner().invoke(app, ["simulate", "--from-ledger", "--days", "1", "--db", url, "--lane", "free", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)  # (stderr names the ledger it read)
    assert res.stderr.startswith(f"lane: ledger {Ledger(url).url.display} (from --db)")
    assert doc["scenario"]["jobs"] == 4  # the settled ones
    assert doc["scenario"]["drift"] == 2.0
    assert doc["scenario"]["config"]["ceiling"] == 5_000 and doc["scenario"]["config"]["max_leased"] == 4


def test_simulate_command_starts_from_a_lanes_limits_and_drops_one(tmp_path):
    url = f"sqlite:///{tmp_path / 'limits.db'}"
    led = Ledger(url)
    try:
        led.set_lane("free", ceiling=50_000, limits=["requests=3/10s", "output_tokens=8000/60s"])
    finally:
        led.close()
    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("noop")(lambda: None)
    args = ["simulate", "--jobs", "20", "--db", url, "--lane", "free", "--json", "--policies", "lane"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scenario"]["config"]["limits"] == [
        ["requests", {"amount": 3, "window_seconds": 10.0}],
        ["output_tokens", {"amount": 8000, "window_seconds": 60.0}],
    ]
    res = CliRunner().invoke(app, [*args, "--limit", "output_tokens=none", "--limit", "input_tokens=900/1m"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["scenario"]["config"]["limits"] == [
        ["requests", {"amount": 3, "window_seconds": 10.0}],
        ["input_tokens", {"amount": 900, "window_seconds": 60.0}],
    ]


def test_simulate_command_reads_a_lanes_rule_12_and_the_flags_change_it(tmp_path):
    """A lane with rule 12 on and Q seeded: the simulation reads both; --overtake-slack off turns it off (and drops
    the lane's Q, which needs the rule), --overtake-day 1 runs the learning day instead of reading the lane's Q."""
    url = f"sqlite:///{tmp_path / 'rule12.db'}"
    led = Ledger(url)
    try:
        led.set_lane("free", ceiling=50_000, overtake_slack=1.5, overtake_q=5_000)
    finally:
        led.close()
    app = typer.Typer()
    app.command("simulate")(simulate_command)
    app.command("noop")(lambda: None)
    args = ["simulate", "--jobs", "300", "--days", "1", "--db", url, "--lane", "free", "--json", "--policies", "lane"]

    def strict(constant):  # Infinity and NaN are not JSON (strict parsers refuse them)
        raise AssertionError(f"{constant} in --json")

    def run(*extra):
        res = CliRunner().invoke(app, [*args, *extra])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout, parse_constant=strict)
        return doc["scenario"]["config"], doc["results"][0]

    cfg, lane = run()
    assert (cfg["overtake_slack"], cfg["overtake_learned"], lane["overtake_q"]) == (1.5, 5_000, 5_000)
    # quiet traffic: nothing ever waited (p99 of V 0), so Q over it is no figure: null, not Infinity
    assert lane["slack_estimate_ratio"] is None
    cfg, lane = run("--overtake-slack", "off")
    assert (cfg["overtake_slack"], cfg["overtake_learned"], lane["overtake_q"]) == (None, None, None)
    cfg, lane = run("--overtake-day", "1")
    assert (cfg["overtake_day"], cfg["overtake_learned"], lane["overtake_q"]) == (1, None, None)
    cfg, _ = run("--overtake-beta", "0.25")
    assert (cfg["overtake_beta"], cfg["overtake_slack"], cfg["overtake_learned"]) == (0.25, None, None)

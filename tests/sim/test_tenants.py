"""Tenants in ``lane simulate`` (issue 23): a tenant column, the generator's --tenants, per-tenant figures,
fairness, and today's order (lane-one-queue) as the baseline of the fair one."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lane_plugin.cli import app
from lane_plugin.errors import TraceError
from lane_plugin.sim import SimConfig, Trace, generate, load_trace, simulate, write_csv
from lane_plugin.sim.tenants import assign_by_hash, parse_tenants


def _backfill_and_interactive() -> Trace:
    tr = Trace()
    for _ in range(600):  # a backfill submits everything at once
        tr.add(0.0, "bulk", 1_000, 1_000, None, tenant="backfill")
    for i in range(20):  # an interactive user, one call every 10 s
        tr.add(5.0 + 10.0 * i, "ask", 1_000, 1_000, None, tenant="interactive")
    return tr.sort()


def test_the_fair_order_serves_the_interactive_tenant_at_once_and_today_s_order_after_the_backfill():
    cfg = SimConfig(
        ceiling=10**9,
        allowance=10**9,
        burst_tokens=10**6,
        max_leased=4,
        workers=4,
        service_base=1.0,
        service_per_token=0.0,
    )
    one, fair = simulate(_backfill_and_interactive(), cfg, ["lane-one-queue", "lane"])
    assert fair.tenants is not None and one.tenants is not None
    assert fair.tenants["interactive"]["wait_p99"] <= 5.0 < one.tenants["interactive"]["wait_p99"] / 10
    assert fair.done == one.done == 620 and fair.end_s == pytest.approx(one.end_s, abs=2.0)  # work-conserving
    assert fair.fair_gap is not None and fair.fair_gap <= 2 * 1_000
    assert fair.jain is not None and one.jain is not None


def test_parse_assign_and_the_tenant_column_round_trip(tmp_path):
    spec = parse_tenants("a:1:3,b:3:1")
    assert spec == [("a", 1.0, 0.75), ("b", 3.0, 0.25)]
    for bad in ("a:1", "a:0:1", "a:x:1", "a:1:0", "a:1:1,a:2:1", "a:1:inf,b:1:1", "a:1:nan", "a:1:1e308,b:1:1e308"):
        with pytest.raises(TraceError, match="tenants="):
            parse_tenants(bad)
    keys = [f"req-{i}" for i in range(4_000)]
    assigned = assign_by_hash(keys, spec)
    assert assigned == assign_by_hash(keys, spec) and 0.72 < assigned.count("a") / len(keys) < 0.78
    tr = generate(300, seed=3, days=0.01, tenants=spec)
    assert set(tr.tenant) == {"a", "b"}
    assert len({tr.tenant[i] for i in range(len(tr)) if tr.run_key[i] == tr.run_key[0]}) == 1  # a run: one tenant
    write_csv(tr, tmp_path / "t.csv")
    assert load_trace(tmp_path / "t.csv").tenant == tr.tenant


def test_the_cli_adds_the_baseline_and_prints_per_tenant_figures():
    res = CliRunner().invoke(
        app,
        [
            "simulate",
            "--jobs",
            "600",
            "--days",
            "0.02",
            "--tenants",
            "backfill:1:0.8,interactive:4:0.2",
            "--json",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = {r["policy"]: r for r in out["results"]} if "results" in out else {r["policy"]: r for r in out["policies"]}
    assert {"lane", "lane-one-queue"} <= set(rows)
    assert set(rows["lane"]["tenants"]) == {"backfill", "interactive"}
    assert rows["lane"]["tenants"]["interactive"]["weight"] == 4.0
    bad = CliRunner().invoke(app, ["simulate", "--jobs", "10", "--tenants", "x:0:1"])
    assert bad.exit_code != 0 and "weight" in bad.output


def _big_amid_small() -> Trace:
    tr = Trace()
    for _ in range(20):  # a burst fills the window
        tr.add(0.0, "small", 1_000, 1_000, None, tenant="b")
    tr.add(1.0, "big", 9_000, 9_000, None, tenant="a")  # then a big job, and small ones at the window's rate
    for i in range(600):
        tr.add(1.0 + 0.5 * (i + 1), "small", 1_000, 1_000, None, tenant="ab"[i % 2])
    return tr.sort()


def test_the_simulator_models_the_overtaking_budget():
    """With the budget (SimConfig.overtake_beta) the big job is passed by at most beta x what it found waiting;
    without, its place holds it back.

    The window admits 20k rate tokens per 10 s and 2k arrive per second: token-fifo serves the big job when
    the window has slid (about 9 s); the order without deadlines holds it behind every small job that
    arrives within ``est * age_factor`` (270 s) after it. With the budget it found 20k waiting: at most 5k of
    later jobs pass it, so it waits at most (20k + 5k + 9k) / 2k per second, within two windows.
    """
    cfg = dict(
        ceiling=10**9,
        allowance=10**9,
        burst_tokens=20_000,
        window_seconds=10.0,
        max_leased=64,
        workers=64,
        service_base=1.0,
        service_per_token=0.0,
        max_wait_seconds=600.0,
    )
    waits = {}
    for beta in (None, 0.25):
        tr = _big_amid_small()
        big = tr.est.index(9_000)
        lane, fifo = simulate(
            tr, SimConfig(**cfg, overtake_slack=None, overtake_beta=beta, overtake_exact=False), ["lane", "token-fifo"]
        )
        waits[beta] = (lane.waits[big], fifo.waits[big])
    (held, fifo), (due, _) = waits[None], waits[0.25]
    assert fifo <= 10.0 and held > 100.0
    assert due <= 1.25 * fifo + 2 * 10.0 + 1.0  # within (1 + beta) x FIFO's plus two windows (and a tick)

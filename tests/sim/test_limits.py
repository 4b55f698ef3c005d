"""``lane simulate --limit``: each limit a sliding window every policy obeys, and which limit bound (rule 6b)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lane_plugin.cli import app
from lane_plugin.policy.limits import Limit
from lane_plugin.sim import policies as sim_policies
from lane_plugin.sim.engine import SimConfig, simulate
from lane_plugin.sim.traffic import Trace, generate

BASE = dict(
    ceiling=1_000_000,
    start_fraction=1.0,
    burst_tokens=100_000,
    window_seconds=10.0,
    max_leased=20,
    workers=20,
    service_base=1.0,
    service_per_token=0.0,
    service_per_output_token=0.0,
    lease_seconds=1_000.0,
)
POLICIES = ["count", "token-fifo", "smallest-first", "lane"]


def calls(*jobs) -> Trace:
    """jobs: (arrival, input_tokens, output_tokens, est); the rate cost is the estimate."""
    tr = Trace()
    for arrival, inp, out, est in jobs:
        tr.add(arrival, "s", est, inp + out, input_tokens=inp, output_tokens=out)
    return tr.sort()


def starts(res) -> list[float]:
    return [round(w, 6) for w in res.waits]


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_limit_slides_for_every_policy(policy):
    # 2 requests in any 10 s: the third call waits until the first leaves the window at t=10.
    tr = calls((0, 100, 10, 200), (1, 100, 10, 200), (2, 100, 10, 200))
    free = simulate(tr, SimConfig(**BASE), [policy])[0]
    assert starts(free) == [0.0, 0.0, 0.0] and free.bound_by is None
    (res,) = simulate(tr, SimConfig(**BASE, limits=(("requests", Limit(2, 10.0)),)), [policy])
    assert starts(res) == [0.0, 0.0, 8.0]
    assert res.bound_by == "requests" and res.limit_held["requests"] == pytest.approx(8.0)
    assert res.over_limits == {"requests": 0}


def test_output_tokens_are_charged_the_allowance_then_trued_up_to_what_was_generated():
    # Each call: input 100, estimate 500 (an output allowance of 400), 50 generated. output_tokens 500 per 60 s:
    # the second call does not fit beside the first's allowance (800 > 500), and fits once the first settles at
    # t=1 and its charge becomes the 50 it generated (450 <= 500), not when it leaves the window at t=60.
    tr = calls((0, 100, 50, 500), (0, 100, 50, 500))
    cfg = SimConfig(**BASE, limits=(("output_tokens", Limit(500, 60.0)),))
    for policy in ("lane", "count"):
        (res,) = simulate(tr, cfg, [policy])
        assert starts(res) == [0.0, 1.0], policy
        assert res.bound_by == "output_tokens" and res.over_limits == {"output_tokens": 0}


def test_the_output_meter_counts_what_a_provider_counting_output_as_generated_refuses(monkeypatch):
    # Ten calls at once, each generating 200 in 1 s, under output_tokens 500/60s: a provider takes calls until
    # what they generated fills its window, and refuses every later one that arrives in that window.
    tr = calls(*[(0, 100, 200, 300)] * 4, *[(2, 100, 200, 300)] * 6)
    cfg = SimConfig(**BASE, limits=(("output_tokens", Limit(500, 60.0)),))
    (obeyed,) = simulate(tr, cfg, ["count"])
    assert obeyed.over_limits == {"output_tokens": 0}
    monkeypatch.setattr(sim_policies, "_kept_out", lambda *a: False)  # the baseline stops checking the limits
    (ignored,) = simulate(tr, cfg, ["count"])
    # the first four pass an empty window (generated 800 at t=1); the six at t=2 arrive at a full one
    assert ignored.over_limits == {"output_tokens": 6 * 200}


def test_the_binding_limit_is_the_one_that_held_the_queue_longest():
    # 40 calls at once, 1,000 tokens each. requests 10/10s (4 windows' worth) and tokens 20,000/10s (2):
    # requests binds. With tokens 5,000/10s (8 windows' worth) tokens binds.
    tr = calls(*[(0, 600, 400, 1_000)] * 40)
    lim = (("requests", Limit(10, 10.0)),)
    by_requests = simulate(tr, SimConfig(**{**BASE, "burst_tokens": 20_000}, limits=lim), ["lane"])[0]
    by_tokens = simulate(tr, SimConfig(**{**BASE, "burst_tokens": 5_000}, limits=lim), ["lane"])[0]
    assert by_requests.bound_by == "requests" and by_requests.end_s == pytest.approx(31.0)
    assert by_tokens.bound_by == "tokens" and by_tokens.end_s == pytest.approx(71.0)
    assert by_tokens.limit_held["tokens"] > by_tokens.limit_held.get("requests", 0.0)


def test_a_call_past_a_limit_is_refused_at_intake():
    tr = calls((0, 900, 10, 1_000), (1, 100, 10, 200))
    (res,) = simulate(tr, SimConfig(**BASE, limits=(("input_tokens", Limit(500, 60.0)),)), ["lane"])
    assert res.refused == 1 and res.done == 1


def test_the_overrun_meter_counts_a_policy_that_ignores_the_limits(monkeypatch):
    tr = generate(300, seed=4, days=0.01)
    cfg = SimConfig(**{**BASE, "burst_tokens": 10**9}, limits=(("requests", Limit(5, 10.0)),))
    obeyed = simulate(tr, cfg, POLICIES)
    assert all(r.over_limits == {"requests": 0} and r.bound_by == "requests" for r in obeyed)
    monkeypatch.setattr(sim_policies, "_kept_out", lambda *a: False)  # the baselines stop checking the limits
    (ignored,) = simulate(tr, cfg, ["count"])
    assert ignored.over_limits["requests"] > 0


def test_config_refuses_a_bad_limit_naming_it():
    with pytest.raises(ValueError, match="unit='tokens'"):
        SimConfig(limits=(("tokens", Limit(5, 1.0)),))
    with pytest.raises(ValueError, match="unit='requests' is given twice"):
        SimConfig(limits=(("requests", Limit(5, 1.0)), ("requests", Limit(6, 1.0))))


def run(*args: str):
    return CliRunner().invoke(app, ["simulate", *args])


@pytest.fixture
def trace_file(tmp_path):
    path = tmp_path / "calls.csv"
    path.write_text("arrival_s,input_tokens,output_tokens\n" + "".join(f"{i},300,40\n" for i in range(30)))
    return str(path)


def test_cli_limit_takes_lane_lanes_set_syntax(trace_file):
    res = run(
        "--trace", trace_file, "--limit", "requests=2/10s", "--limit", "tokens=none", "--policies", "lane", "--json"
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    cfg = out["scenario"]["config"]
    assert cfg["limits"] == [["requests", {"amount": 2, "window_seconds": 10.0}]]
    assert cfg["burst_tokens"] == 2**53
    (r,) = out["results"]
    assert r["bound_by"] == "requests" and r["over_limits"] == {"requests": 0}
    assert "bound_by" in out["figures"]


def test_cli_limit_in_the_table(trace_file):
    res = run("--trace", trace_file, "--limit", "requests=2/10s", "--policies", "lane,count")
    assert res.exit_code == 0, res.output
    assert "requests 2/10s" in res.output
    assert "bound by" in res.output and "requests" in res.output.split("bound by", 1)[1].splitlines()[0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--limit", "rpm=5/1s"], "unknown unit 'rpm'"),
        (["--limit", "requests=5"], "'requests=5'"),
        (["--limit", "requests=5/1s", "--limit", "requests=6/1s"], "requests is limited twice"),
        (["--limit", "tokens=100/1s", "--burst-tokens", "500"], "--burst-tokens both set the tokens window"),
    ],
)
def test_cli_bad_limit_exits_2_naming_it(trace_file, flags, said):
    res = run("--trace", trace_file, *flags)
    assert res.exit_code == 2
    assert said in res.output

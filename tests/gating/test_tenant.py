"""``tenant=`` through the gate (issue 23): a string, a callable of the task's arguments, or the default
(the flow run's deployment name, else the flow's name, else ``default``)."""

from __future__ import annotations

import pytest
from prefect import flow

from lane_plugin import InvalidInput, gate, lane_task

from ..tables import job_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def test_the_tenant_is_given_computed_or_the_flows_name(ledger):
    ledger.set_lane("t", allowance=10**6, ceiling=10**6)

    @lane_task(stage="given", estimate=10, lane="t", tenant="search-team")
    def given():
        return 5

    @lane_task(stage="computed", estimate=10, lane="t", tenant=lambda doc, team: f"team-{team}")
    def computed(doc: str, team: str):
        return 5

    @lane_task(stage="defaulted", estimate=10, lane="t")
    def defaulted():
        with gate(stage="inner", estimate=10, lane="t", tenant="inner-team") as g:
            g.report(3)
        return 5

    @flow(name="nightly-backfill")
    def f():
        return given(), computed("x", "ops"), defaulted()

    f()
    tenants = {r["stage"]: ledger.job(r["id"])["tenant"] for r in job_rows(ledger)}
    assert tenants == {
        "given": "search-team",
        "computed": "team-ops",
        "defaulted": "nightly-backfill",
        "inner": "inner-team",
    }
    assert {t["tenant"] for t in ledger.tenants("t")} == set(tenants.values())


def test_a_bad_tenant_is_refused_before_anything_is_written(ledger):
    with pytest.raises(InvalidInput, match="tenant"):
        lane_task(stage="s", estimate=10, tenant="")
    with pytest.raises(InvalidInput, match="tenant"):
        gate(stage="s", estimate=10, tenant=lambda: "x")
    with pytest.raises(InvalidInput, match="tenant"):
        lane_task(stage="s", estimate=10, tenant="x" * 65)
    with pytest.raises(InvalidInput, match="control character"):
        gate(stage="s", estimate=10, tenant="team\nb")
    assert job_rows(ledger) == []


def test_a_default_tenant_never_carries_a_control_character(monkeypatch):
    from lane_plugin.gating import ledgers

    monkeypatch.setattr(ledgers, "_deployment_or_flow", lambda run_id: "nightly\tbackfill")
    assert ledgers.default_tenant("a-run-of-review4") == "nightly?backfill"  # a valid tenant name

"""deployments/: prefect.yaml and serve.py agree, their entrypoints load, and the Automation example validates."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WANT = {"drift-report": 3600, "park-overdue": 60, "lane-status": 300}  # the schedules


def prefect_yaml() -> dict:
    return yaml.safe_load((ROOT / "deployments" / "prefect.yaml").read_text())


def test_prefect_yaml_schedules_and_entrypoints_load_from_the_repo_root(monkeypatch):
    from prefect.flows import load_flow_from_entrypoint

    monkeypatch.chdir(ROOT)
    found = {}
    for dep in prefect_yaml()["deployments"]:
        flow = load_flow_from_entrypoint(dep["entrypoint"])  # relative: as `prefect deploy` resolves it
        found[flow.name] = dep["schedules"][0]["interval"]
        assert dep["work_pool"]["name"] == "lane-ops"
        assert dep["name"] == flow.name
        assert set(dep.get("parameters", {})) <= set(flow.parameters.properties), dep["entrypoint"]
    assert found == WANT


def test_serve_builds_the_same_deployments(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "deployments"))
    import serve

    deps = serve.deployments()
    assert {d.flow_name: d.schedules[0].schedule.interval.total_seconds() for d in deps} == WANT
    assert {d.name for d in deps} == set(WANT)  # one name per deployment: the Deployments page tells them apart
    assert all(not Path(d.entrypoint.split(":")[0]).is_absolute() for d in deps)
    yaml_params = {
        Path(d["entrypoint"]).stem.replace("_", "-"): d.get("parameters", {}) for d in prefect_yaml()["deployments"]
    }
    assert {d.flow_name: d.parameters for d in deps} == yaml_params
    assert [d.flow_name for d in serve.deployments(["lane-status"], schedule=False)] == ["lane-status"]
    assert not serve.deployments(["lane-status"], schedule=False)[0].schedules
    with pytest.raises(SystemExit, match="unknown flow nope"):
        serve.deployments(["nope"])
    sys.modules.pop("serve", None)


def test_automation_examples_validate():
    from prefect.events.schemas.automations import AutomationCore

    path = ROOT / "deployments" / "automations.yaml"
    docs = yaml.safe_load(path.read_text().replace("<BLOCK_DOCUMENT_ID>", "00000000-0000-0000-0000-000000000000"))
    autos = [AutomationCore.model_validate(a) for a in docs["automations"]]
    names = {a.trigger.expect.pop() if a.trigger.expect else None for a in autos}
    assert names == {"lane.*", "lane.tail.high", "lane.job.parked", "lane.drift.high"}


@pytest.mark.usefixtures("prefect_server")
def test_serve_refuses_to_take_over_a_worker_deployment_unless_asked(monkeypatch, capsys):
    """prefect.yaml + worker, then serve.py: reproduced on a real server, every run crashed with
    'Downloading flow code from storage at None'. serve.py now refuses, naming the deployment."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT / "deployments"))
    import serve

    deps = serve.deployments(["lane-status"], schedule=False)
    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(WorkPoolCreate(name="lane-ops-t13", type="process"))
        except ObjectAlreadyExists:
            pass
        flow_id = client.create_flow_from_name("lane-status")
        client.create_deployment(
            flow_id=flow_id,
            name="lane-status",
            work_pool_name="lane-ops-t13",
            entrypoint="flows/lane_status.py:lane_status",
        )
    assert serve.pooled(deps) == [("lane-status/lane-status", "lane-ops-t13")]
    with pytest.raises(SystemExit) as refused:
        serve.main(["--only", "lane-status", "--no-schedule"])
    msg = str(refused.value)
    assert "lane-status/lane-status (work pool lane-ops-t13)" in msg and "--take-over" in msg
    assert "prefect deployment delete lane-status/lane-status" in msg
    serve.take_over(["lane-status/lane-status"])
    assert "deleted deployment lane-status/lane-status" in capsys.readouterr().out
    with get_client(sync_client=True) as client, pytest.raises(ObjectNotFound):
        client.read_deployment_by_name("lane-status/lane-status")
    assert serve.pooled(deps) == []
    sys.modules.pop("serve", None)

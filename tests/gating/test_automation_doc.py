"""docs/automations.md: the automation it tells people to create is one Prefect accepts."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DOC = Path(__file__).resolve().parents[2] / "docs" / "automations.md"


def test_the_documented_automation_validates_and_matches_our_events():
    from prefect.automations import AutomationCore
    from prefect.events.schemas.events import Event

    from lane_plugin.gating.events import resource

    block = re.search(r"```yaml\n(.*?)```", DOC.read_text(), re.S).group(1)
    automation = AutomationCore.model_validate(yaml.safe_load(block))
    trigger = automation.trigger
    assert trigger.expect == {"lane.*"}
    from prefect.events.schemas.events import matches

    from lane_plugin.gating.events import job_resource, state_event_name

    change = {"lane": "free", "state": "finishing-only", "start_fraction": 0.8}
    event = Event(event=state_event_name(change), resource={**resource("free"), "lane.state": "finishing-only"})
    assert trigger.match.matches(event.resource) and any(matches(e, event.event) for e in trigger.expect)
    # a job event of the same lane is not a state change: its resource has no lane.state
    job = Event(event="lane.job.settled", resource=job_resource("free", {"est": 5, "actual": 6}))
    assert any(matches(e, job.event) for e in trigger.expect) and not trigger.match.matches(job.resource)
    recovered = {**resource("free"), "lane.state": "ok"}
    assert not trigger.match.matches(Event(event="x", resource=recovered).resource)
    assert not trigger.match.matches(Event(event="x", resource={"prefect.resource.id": "prefect.flow-run.1"}).resource)
    assert automation.actions[0].type == "send-notification"

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
    assert trigger.expect == {"lane.lane.start-stop"}
    event = Event(event="lane.lane.start-stop", resource=resource("free"), payload={"committed": 1})
    assert trigger.match.matches(event.resource) and event.event in trigger.expect
    assert not trigger.match.matches(Event(event="x", resource={"prefect.resource.id": "prefect.flow-run.1"}).resource)
    assert automation.actions[0].type == "send-notification"

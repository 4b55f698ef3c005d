"""``lane automations apply``: create the Automations in ``deployments/automations.yaml``.

The file says ``block_document_id: <BLOCK_DOCUMENT_ID>`` where a notification
block belongs; Prefect cannot create it as it stands ("a wall of pydantic
errors"). This fills in the id of the block you name, validates every
automation, creates each one (or updates the one of the same name, so it can
run again) and says what it did.

Example:
    $ lane automations apply --block slack-webhook/lane-alerts
    created automation 'lane tail above threshold' (id 5c1f...): on lane.tail.high -> send-notification
"""

from __future__ import annotations

import uuid
from pathlib import Path

from .errors import DatabaseError, InvalidInput

PLACEHOLDER = "<BLOCK_DOCUMENT_ID>"
ANY_ID = "00000000-0000-0000-0000-000000000000"  # stands in for the block's id while the file is checked offline
DEFAULT_FILE = Path("deployments") / "automations.yaml"


def block_document_id(block: str) -> str:
    """The id of block document ``TYPE-SLUG/NAME`` (e.g. ``slack-webhook/lane-alerts``) on the Prefect API."""
    if "/" not in block:
        raise InvalidInput(
            "block", block, "expected BLOCK-TYPE/NAME, e.g. slack-webhook/lane-alerts (prefect block ls)"
        )
    slug, name = block.split("/", 1)
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    try:
        with get_client(sync_client=True) as client:
            doc = client.read_block_document_by_name(name=name, block_type_slug=slug)
    except ObjectNotFound:
        raise InvalidInput("block", block, "no such block on the Prefect API (prefect block ls lists them)") from None
    except Exception as exc:
        raise DatabaseError(f"cannot read block {block}: the Prefect API did not answer ({exc})") from None
    return str(doc.id)


def load(path: Path, block_id: str) -> list:
    """The automations in ``path`` with ``block_id`` in place of the placeholder, validated by Prefect."""
    import yaml
    from prefect.events.schemas.automations import AutomationCore
    from pydantic import ValidationError

    if not path.is_file():
        raise InvalidInput("file", str(path), "not found (run from the repository root, or pass --file)")
    try:
        data = yaml.safe_load(path.read_text().replace(PLACEHOLDER, block_id))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise InvalidInput(
            "file", str(path), f"is not valid YAML{where}: {getattr(exc, 'problem', None) or exc}"
        ) from None
    items = data.get("automations", [data]) if isinstance(data, dict) else data
    if not isinstance(items, list) or not items:
        raise InvalidInput("file", str(path), "holds no automations (expected a list of them, or automations: [...])")
    out = []
    for i, item in enumerate(items):
        try:
            out.append(AutomationCore.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ()))
            name = item.get("name", f"#{i + 1}") if isinstance(item, dict) else f"#{i + 1}"
            raise InvalidInput(f"automation {name!r} field {where}", first.get("input"), first.get("msg")) from None
    return out


def apply(path: Path, block_id: str | None = None, block: str | None = None) -> list[str]:
    """Create (or update, by name) each automation; returns one line per automation saying what happened.

    The file and ``block_id`` are checked before the Prefect API is asked anything (which may start a
    server): a typo is refused at once. ``block`` (``TYPE/NAME``) is looked up when no ``block_id`` is given.
    """
    from prefect import get_client

    if block_id is not None:
        try:
            block_id = str(uuid.UUID(str(block_id)))
        except ValueError:
            raise InvalidInput("--block-id", block_id, "expected a block document's UUID (prefect block ls)") from None
    automations = load(path, block_id or ANY_ID)
    if block_id is None:  # the file is sound: now ask Prefect for the block's id
        automations = load(path, block_document_id(block))
    lines = []
    with get_client(sync_client=True) as client:
        for auto in automations:
            existing = client.read_automations_by_name(auto.name)
            what = f"on {', '.join(sorted(auto.trigger.expect)) or 'any event'} -> " + ", ".join(
                a.type for a in auto.actions
            )
            if existing:
                client.update_automation(existing[0].id, auto)
                lines.append(f"updated automation {auto.name!r} (id {existing[0].id}): {what}")
            else:
                new_id = client.create_automation(auto)
                lines.append(f"created automation {auto.name!r} (id {new_id}): {what}")
    return lines

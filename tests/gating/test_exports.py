"""The public names reach the gate whichever module a caller imports first; the ledger alone stays light."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import lane_plugin

from ..lane_process import run_python

CHECK = """
import lane_plugin
{first}
from lane_plugin import Gate, gate, lane_task, report_usage
g = gate(stage="s", estimate=10)
assert isinstance(g, Gate), type(g)
assert isinstance(lane_plugin.gate(stage="s", estimate=10), Gate)
assert callable(lane_task) and callable(report_usage)
print("ok")
"""


# Prefect imports its parts lazily: these are the ones the package's modules import.
PRELOAD = (
    "prefect.flows",
    "prefect.tasks",
    "prefect.task_runners",
    "prefect.artifacts",
    "prefect.events",
    "prefect.blocks.core",
    "prefect.client.orchestration",
    "typer",
    "rich.console",
)


def run(first: str) -> str:
    # Forked from a process that has imported Prefect but no lane_plugin module: each check still imports the
    # whole package afresh, in its own order, for a fraction of a cold start's CPU (LANE_CLI_EXEC=1 execs each).
    out = run_python(CHECK.format(first=first), preload=PRELOAD)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_public_names_first():
    assert run("") == "ok"


def test_gating_package_imported_first():
    assert run("import lane_plugin.gating\nfrom lane_plugin.gating import get_ledger") == "ok"


@pytest.mark.parametrize(
    "module",
    sorted(m.name for m in pkgutil.walk_packages(lane_plugin.__path__, "lane_plugin.") if ".migrations" not in m.name),
)
def test_every_module_imports_first(module):
    assert run(f"import {module}") == "ok"


def test_ledger_import_does_not_import_prefect():
    code = "import sys, lane_plugin; lane_plugin.Ledger; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]

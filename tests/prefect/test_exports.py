"""``lane_plugin.gate`` names both a submodule and a function: both ways of reaching it work."""

from __future__ import annotations

import subprocess
import sys

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


def run(first: str) -> str:
    out = subprocess.run([sys.executable, "-c", CHECK.format(first=first)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_public_names_first():
    assert run("") == "ok"


def test_submodule_imported_first():
    assert run("import lane_plugin.gate\nfrom lane_plugin.gate import get_ledger") == "ok"


def test_ledger_import_does_not_import_prefect():
    code = "import sys, lane_plugin; lane_plugin.Ledger; print('prefect' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_gated_task_module_imported_first():
    assert run("import lane_plugin.gated_task") == "ok"

"""docs/performance.md as benchmarks/run_all.py writes it: one title per section, none inside an output block."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_all():
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_benchmarks_printed_heading_is_not_repeated_inside_its_output_block():
    # bench_provider.py prints "## Provider benchmark: ..." first (a title when run alone); the page has the
    # section's title already, and inside the ``` block the heading read as a second one.
    printed = "## Provider benchmark: one workload, three ways\n\nCommand: `python benchmarks/bench_provider.py`\n"
    assert run_all().without_heading(printed) == "Command: `python benchmarks/bench_provider.py`"
    assert run_all().without_heading("sqlite: one pass parked\n") == "sqlite: one pass parked"  # no heading: as is


def test_the_performance_page_has_no_heading_inside_an_output_block():
    fenced, inside = False, []
    for n, line in enumerate((ROOT / "docs" / "performance.md").read_text().splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
        elif fenced and line.startswith("#"):
            inside.append(f"{n}: {line}")
    assert not inside, inside

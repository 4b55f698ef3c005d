"""The performance pages (docs/performance/) as benchmarks/run_all.py writes them: one title per section, none
inside an output block, none over 400 lines, and laid out from the benchmarks' stored sections."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = ROOT / "docs" / "performance"


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


def test_the_performance_pages_have_no_heading_inside_an_output_block():
    inside = []
    for page in sorted(PAGES.glob("*.md")):
        fenced = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
            elif fenced and line.startswith("#"):
                inside.append(f"{page.name}:{n}: {line}")
    assert not inside, inside


def test_the_pages_are_the_stored_sections_laid_out_and_none_is_over_400_lines():
    module = run_all()
    stamp = module.stored_stamp()
    assert stamp and stamp.startswith("Machine: ")
    expected = module.render_pages(stamp)
    for name, text in expected.items():
        assert (PAGES / name).read_text() == text, f"{name} is stale: python benchmarks/run_all.py --pages-only"
        assert len(text.splitlines()) <= 400, name


def test_a_long_section_is_split_at_its_subheadings_and_the_parts_link_each_other():
    module = run_all()
    text = "intro\n" + "\n".join(f"### part {n}\n" + "row\n" * 150 for n in range(4))
    parts = module.split_at_subheadings(text, limit=380)
    assert [p.count("### ") for p in parts] == [2, 2] and "\n".join(parts).count("row") == 600
    fenced = "### a\n```\n### not a heading\n```\n"
    assert module.split_at_subheadings(fenced, limit=1) == [fenced.strip()]

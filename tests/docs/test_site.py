"""The docs site's sources: every page in the nav, none over 400 lines (the generated CLI pages included), every
``lane`` command in the CLI reference, and included files' links pointed at the site's pages.

``mkdocs build --strict`` itself runs in ``.ci/run`` (it needs the ``docs`` extra); these checks need only the
package, so a missing page or command fails the plain test run too.
"""

from __future__ import annotations

import importlib.util
import re

import yaml

from .blocks import ROOT

DOCS = ROOT / "docs"
MAX_LINES = 400


def hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[str]:
    """Every page of the site: markdown under docs/ but the benchmarks' raw sections (mkdocs.yml exclude_docs)."""
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if not re.match(r"performance_", p.name))


def nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in nav_pages(v)]
    return [p for v in node for p in nav_pages(v)]


def rendered(page: str) -> str:
    """A page's markdown as the site builds it: the CLI and include markers replaced."""
    h = hooks()
    text = (DOCS / page).read_text()
    text = h.CLI_MARKER.sub(lambda m: h.command_reference(m.group("path").split()), text)
    return h.INCLUDE_MARKER.sub(lambda m: h.include(m.group("path"), page), text)


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=yaml.BaseLoader)
    assert sorted(nav_pages(config["nav"])) == pages()


def test_no_page_is_over_400_lines_as_built():
    long = {page: n for page in pages() if (n := len(rendered(page).splitlines())) > MAX_LINES}
    assert not long, long


def test_every_lane_command_is_in_the_cli_reference():
    h = hooks()
    shown = [
        m.group("path") for p in (DOCS / "reference" / "cli").glob("*.md") for m in h.CLI_MARKER.finditer(p.read_text())
    ]
    assert sorted(shown) == sorted(h.all_commands()), "add a '<!-- lane-cli: COMMAND -->' line for a new command"
    assert len(shown) == len(set(shown))
    text = rendered("reference/cli/lanes.md")
    assert (
        "## `lane lanes set`" in text and "`--burst-tokens <int>`: Rate tokens admitted in any sliding window." in text
    )


def test_an_included_file_links_to_the_sites_pages_and_names_other_files():
    h = hooks()
    h._included_by.update({"tests/README.md": "development.md", "tests/faults/README.md": "faults.md"})
    faults = h.include("tests/faults/README.md", "faults.md")
    assert faults.startswith("## Fault tests") and "[docs/architecture.md](architecture.md)" in faults
    dev = h.include("tests/README.md", "development.md")
    assert "[faults/README.md](faults.md)" in dev
    # from a page one level down, and a file of the repository that is no page: shown as its path
    assert h.include("tests/README.md", "reference/x.md").count("(../faults.md)") == 1
    assert "`scripts/ui_check.py`" in h.include("tests/README.md", "development.md")

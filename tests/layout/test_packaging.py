"""What a user's tools read from the package: the license pyproject names, and the ``py.typed`` marker in the wheel."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+ (the suite's own; 3.10 users need no pyproject reader)
ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_file_is_the_apache_2_text_pyproject_names():
    project = PYPROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    # the full text: the nine sections of the terms and the appendix, not a stub pointing elsewhere
    headings = ["1. Definitions.", "4. Redistribution.", "9. Accepting Warranty or Additional Liability."]
    headings += ["END OF TERMS AND CONDITIONS", "APPENDIX: How to apply the Apache License to your work."]
    for heading in headings:
        assert heading in text, heading
    assert len(text.splitlines()) == 202


def test_the_package_ships_its_py_typed_marker():
    assert (ROOT / "lane_plugin" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["lane_plugin"]


def test_the_type_check_covers_the_policy_and_the_public_api():
    """pyproject's [tool.mypy] holds lane_plugin/policy and the modules behind lane_plugin's public names to
    its rules (the rest of the package is analysed, not yet held): a public module left out is caught here."""
    import lane_plugin
    import lane_plugin.gating

    mypy = PYPROJECT["tool"]["mypy"]
    assert mypy["strict"] is True
    held = {m for o in mypy["overrides"] if o.get("ignore_errors") is False for m in o["module"]}
    assert {"lane_plugin.policy", "lane_plugin.policy.*"} <= held
    public = {lane_plugin.__name__}
    for name in lane_plugin.__all__:
        if name == "__version__":
            continue
        obj = getattr(lane_plugin, name)
        public.add(getattr(obj, "__module__", None) or type(obj).__module__)
    public |= {"lane_plugin.ledger", "lane_plugin.gating"}  # the packages the names come through
    assert public <= held, sorted(public - held)


def test_the_changelog_has_an_unreleased_section_and_an_entry_for_this_version():
    headings = [line for line in (ROOT / "CHANGELOG.md").read_text().splitlines() if line.startswith("## ")]
    assert headings[0] == "## [Unreleased]"
    version = PYPROJECT["project"]["version"]
    assert any(h.startswith(f"## [{version}] - ") for h in headings), (version, headings)

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


"""A griffe extension (mkdocs.yml, mkdocstrings' python handler): the package's docstrings as the API pages show them.

The docstrings are Google style with two habits griffe reads otherwise: an ``Example:`` section (Napoleon's
name; griffe's Google parser knows only ``Examples:`` and would show the doctest as prose), and Sphinx roles
(``:func:`admit```, ``:class:`~lane_plugin.Ledger```), which it would show as written. This reads the first as
``Examples:`` and shows each role as the code it names (its last dotted part when the target starts with ``~``).

Example:
    >>> plain(":func:`admit` and :class:`~lane_plugin.ledger.Ledger`\\n\\n    Example:\\n        >>> 1")
    '`admit` and `Ledger`\\n\\n    Examples:\\n        >>> 1'
"""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:func|meth|class|mod|attr|data|obj|exc|const):`(?P<target>[^`]+)`")
EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example:[ \t]*$", re.M)


def _code(match: re.Match[str]) -> str:
    target = match.group("target")
    if target.startswith("~"):
        target = target[1:].rsplit(".", 1)[-1]
    return f"`{target}`"


def plain(docstring: str) -> str:
    """A docstring with its roles as code and its ``Example:`` sections as ``Examples:``."""
    return EXAMPLE.sub(r"\g<indent>Examples:", ROLE.sub(_code, docstring))


class PlainDocstrings(griffe.Extension):
    """Rewrites every docstring of the loaded package once it is loaded (see the module's docstring)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)

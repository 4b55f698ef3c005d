"""The package's shape (issue 9): no import cycles, short modules, SQL only inside the ledger."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "lane_plugin"
SQL = re.compile(r"^\s*(select\s.+\sfrom\s|insert\s+into\s|update\s+\w+\s+set\s|delete\s+from\s)", re.I | re.S)


def modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``name`` imports, anywhere in its body (lazy imports count)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = ".".join(base[: len(base) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def test_no_import_cycle_between_modules():
    mods = modules()
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for n in sorted(graph[m]):
            if state.get(n) == "open":
                cycles.append(" -> ".join(stack[stack.index(n):] + [n]))
            elif n not in state:
                visit(n, stack + [n])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize("name", sorted(modules()))
def test_module_is_at_most_450_lines(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= 450, f"{name} has {lines} lines"


def test_sql_statements_only_inside_the_ledger():
    outside = []
    for name, path in modules().items():
        if name.startswith("lane_plugin.ledger"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.match(node.value):
                outside.append(f"{name}:{node.lineno}: {node.value[:60]!r}")
    assert not outside, "SQL outside lane_plugin.ledger:\n" + "\n".join(outside)

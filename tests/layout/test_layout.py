"""The package's shape (issue 9): no import cycles, short modules, SQL only inside the ledger."""

from __future__ import annotations

import ast
import re
import sys
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
                cycles.append(" -> ".join(stack[stack.index(n) :] + [n]))
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


# Issue 25: the admission policy is one package, lane_plugin/policy/, and stays pure.
ROOT = PKG.parent
POLICY = "lane_plugin.policy"
OLD_PATHS = ("lane_plugin.rules", "lane_plugin.drift", "lane_plugin.reserve", "lane_plugin.sizeclass")
# Third-party code the policy may use: numpy, imported lazily by drift.fit_drift_arrays (the simulator's ring).
POLICY_MAY_IMPORT = {"numpy"}


def repo_python_files() -> list[Path]:
    skip = {".venv", ".venv-prefect-oldest", "prefect_suite", ".git", "build", "node_modules", ".prefect-home"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, name: str | None = None) -> list[tuple[int, str, list[str]]]:
    """Every import in ``path`` (module ``name``) as ``(line, absolute module, names)``; ``names`` empty for ``import x``."""
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, target, [a.name for a in node.names]))
    return out


def policy_modules() -> dict[str, Path]:
    return {name: path for name, path in modules().items() if name == POLICY or name.startswith(POLICY + ".")}


def policy_all() -> set[str]:
    """The names in ``lane_plugin/policy/__init__.py``'s ``__all__``."""
    for node in ast.parse(policy_modules()[POLICY].read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def defined_names(path: Path) -> set[str]:
    """Top-level names a module defines itself (not those it imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def test_the_old_policy_modules_are_gone_and_nothing_imports_them():
    assert not [m for m in OLD_PATHS if (ROOT / (m.replace(".", "/") + ".py")).exists()]
    found = []
    for path in repo_python_files():
        for line, target, names in imported(path):
            hits = [target] if target in OLD_PATHS else []
            hits += [f"{target}.{n}" for n in names if f"{target}.{n}" in OLD_PATHS]
            found += [f"{path.relative_to(ROOT)}:{line}: {hit}" for hit in hits]
    assert not found, "imports by the old paths (now lane_plugin.policy.*):\n" + "\n".join(found)


def test_each_policy_name_is_imported_from_the_package_or_the_module_that_holds_it():
    """``from lane_plugin.policy import X``: X is in the package's ``__all__`` or a submodule;
    ``from lane_plugin.policy.sub import X``: ``sub`` defines X (no name reaches a caller through a re-export)."""
    mods = policy_modules()
    public = policy_all()
    subs = {name.rpartition(".")[2] for name in mods if name != POLICY}
    defined = {name: defined_names(path) for name, path in mods.items() if name != POLICY}
    wrong = []
    for path in repo_python_files():
        inside = module_name(path).startswith(POLICY + ".")  # the package's own modules import each other
        for line, target, names in imported(path):
            if target == POLICY and not inside:
                bad = [n for n in names if n not in public and n not in subs]
            elif target in defined and not inside:
                bad = [n for n in names if n not in defined[target]]
            else:
                continue
            wrong += [f"{path.relative_to(ROOT)}:{line}: from {target} import {n}" for n in bad]
    assert not wrong, "names imported from where they are not defined:\n" + "\n".join(wrong)


def test_the_policy_package_exports_exactly_its_all():
    tree = ast.parse(policy_modules()[POLICY].read_text())
    bound = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names} - {"annotations"}
    exported = policy_all()
    assert exported and bound == exported, (sorted(bound - exported), sorted(exported - bound))


def impure_imports(mods: dict[str, Path]) -> list[str]:
    """The imports of ``mods`` (policy modules) outside the standard library, the policy itself and numpy."""
    stdlib = set(sys.stdlib_module_names)
    found = []
    for name, path in mods.items():
        for line, target, _ in imported(path, name):
            top = target.partition(".")[0]
            if target == POLICY or target.startswith(POLICY + ".") or top in stdlib or top in POLICY_MAY_IMPORT:
                continue
            found.append(f"{name}:{line}: {target}")
    return found


def test_the_policy_is_pure():
    """No database, no Prefect, no store or simulator: lane_plugin.policy imports only the standard
    library, itself and numpy (anywhere in its modules, lazy imports included)."""
    found = impure_imports(policy_modules())
    assert not found, "the policy must stay pure:\n" + "\n".join(found)


def test_the_purity_check_sees_a_forbidden_import(tmp_path):
    """The check above reads what it must: imports of the store, the gate, the simulator, Prefect and SQL
    libraries, even lazy ones inside a function of a policy module, are found; the policy's own are not."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from . import lane\nfrom .drift import capped\nimport math\n\n\n"
        "def f():\n    from ..ledger import db\n    from ..gating import task\n    from lane_plugin.sim import engine\n"
        "    import prefect\n    import sqlalchemy.orm\n    from sqlmodel import Field\n    return db, task, engine, Field\n"
    )
    found = impure_imports({"lane_plugin.policy.probe": probe})
    assert [f.rpartition(": ")[2] for f in found] == [
        "lane_plugin.ledger",
        "lane_plugin.gating",
        "lane_plugin.sim",
        "prefect",
        "sqlalchemy.orm",
        "sqlmodel",
    ]

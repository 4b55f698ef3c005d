"""The package's shape (issue 9): no import cycles, short modules, SQL only inside the ledger's queries module
(issue 26), a Ledger without mixins."""

from __future__ import annotations

import ast
import os
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "lane_plugin"


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


# The one module of SQL text (issue 26): a catalogue of named statements, long by nature.
QUERIES = "lane_plugin.ledger.queries"
# Split by responsibility, not by a line count: the ledger's facade holds one method per public call (its
# docstring is the API reference), each a short transaction or a call to the part that does the work.
NOT_SIZED = {QUERIES, "lane_plugin.ledger.api"}


@pytest.mark.parametrize("name", sorted(set(modules()) - NOT_SIZED))
def test_module_is_at_most_450_lines(name):
    lines = len(modules()[name].read_text().splitlines())
    assert lines <= 450, f"{name} has {lines} lines"


# SQL text, as a string literal (an f-string's pieces joined with "{}") begins: a statement, ...
SQL_STATEMENT = re.compile(
    r"^\s*(select\s|insert\s+(or\s+\w+\s+)?into\s|replace\s+into\s|update\s+\w+\s+set\s|delete\s+from\s|"
    r"with\s+\w+\s+as\s*\(|pragma\s|set\s+(transaction|session|local|search_path)\b|lock\s+table\s|"
    r"(create|drop|alter)\s+(table|index|unique|schema|view)\b|notify\s+\w|"
    r"explain\s+(query\s+plan\s+|analyze\s+)?(select|insert|update|delete|with)\b|"
    # the statements of one or two words, whole (prose may begin with these words)
    r"(begin(\s+(immediate|exclusive|deferred|transaction))?|commit|rollback(\s+to\s+(savepoint\s+)?\w+)?|"
    r"savepoint\s+\w+|release\s+(savepoint\s+)?\w+|(listen|unlisten)\s+(\w+|\{\})|vacuum|analyze)\s*\Z)",
    re.S,
)
# ... or a piece of one: a clause with a :parameter, an ordering, a lock, an upsert, a join.
SQL_PIECE = re.compile(
    r"(\bwhere\s+[\w.]+\s*(=|<|>|in\b|is\b)|\b(and|or)\s+[\w.]+\s*(=|<|>|<=|>=)\s*:\w|^\s*[\w.]+\s*(=|<|>|<=|>=)\s*:\w|"
    r"\border\s+by\s+\w|\bgroup\s+by\s+\w|\bfor\s+update\b|\bon\s+conflict\b|\breturning\s+\w|"
    r"\bjoin\s+\w+\s+\w+\s+on\s|\bunion\s+all\s+select\b|\bcoalesce\(\w)"
)


def sql_literals(path: Path, pattern: re.Pattern[str]) -> list[tuple[int, str]]:
    """``(line, text)`` of the string literals in ``path`` that ``pattern`` finds (docstrings left out)."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in ast.walk(node) if v is not node}
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
        elif isinstance(node, ast.JoinedStr):
            value = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
        else:
            continue
        if pattern.search(value):
            found.append((node.lineno, value))
    return sorted(found)


def outside_queries() -> dict[str, Path]:
    """The package's modules but the queries module (the ledger's migrations are history: left out by modules())."""
    return {name: path for name, path in modules().items() if name != QUERIES}


def test_no_sql_statement_outside_the_queries_module():
    """Every statement the package runs is named in lane_plugin/ledger/queries.py (issue 26: one door)."""
    found = []
    for name, path in sorted(outside_queries().items()):
        found += [f"{name}:{line}: {text[:70]!r}" for line, text in sql_literals(path, SQL_STATEMENT)]
    assert not found, "SQL statements outside lane_plugin.ledger.queries:\n" + "\n".join(found)


def test_no_piece_of_sql_outside_the_queries_module():
    """Nor does any other module build a statement from pieces of SQL text: a statement that varies by call is a
    builder function of the queries module, given plain values (flags, parameter names)."""
    found = []
    for name, path in sorted(outside_queries().items()):
        found += [f"{name}:{line}: {text[:70]!r}" for line, text in sql_literals(path, SQL_PIECE)]
    assert not found, "pieces of SQL outside lane_plugin.ledger.queries:\n" + "\n".join(found)


def test_the_sql_check_sees_statements_and_pieces(tmp_path):
    """The checks above find what they must: statements and pieces in plain and f-strings, lazy or not;
    docstrings and prose are not SQL."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""Select the lanes: this docstring is prose."""\n\n'
        'A = "select id from job where lane = :l"\n'
        "def f(cols, lane):\n"
        '    """Update the lane set by the caller."""\n'
        '    cur.execute(f"update lane set {cols} where name = :n")\n'
        '    cur.execute("begin immediate")\n'
        '    raise ValueError("begin the run again, then commit it")\n'
        '    tail = " order by prio, id" if lane else ""\n'
        '    more = "and tenant = :tn"\n'
        '    print("the lane is full; try later")\n'
    )
    assert [line for line, _ in sql_literals(probe, SQL_STATEMENT)] == [3, 6, 7]
    assert [line for line, _ in sql_literals(probe, SQL_PIECE)] == [3, 6, 9, 10]


# Issue 25: the admission policy is one package, lane_plugin/policy/, and stays pure.
ROOT = PKG.parent
POLICY = "lane_plugin.policy"
OLD_PATHS = ("lane_plugin.rules", "lane_plugin.drift", "lane_plugin.reserve", "lane_plugin.sizeclass")
# Third-party code the policy may use: numpy, imported lazily by drift.fit_drift_arrays (the simulator's ring).
POLICY_MAY_IMPORT = {"numpy"}


def repo_python_files() -> list[Path]:
    """The repository's own Python files: every venv (``.venv*``), the vendored Prefect suite and build output are
    not walked into at all (walking the venvs and filtering after took half a minute a test)."""
    skip = {"prefect_suite", ".git", "build", "node_modules", ".prefect-home", "site", "__pycache__"}
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in skip and not d.startswith(".venv")]
        out += [Path(folder) / f for f in files if f.endswith(".py")]
    return out


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


def test_the_ledger_is_a_facade_without_mixins():
    """``Ledger`` inherits nothing: its parts (ticks, reads, learning, provider limits) are composed into it."""
    tree = ast.parse((PKG / "ledger" / "api.py").read_text())
    [ledger] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Ledger"]
    assert not ledger.bases, [ast.unparse(b) for b in ledger.bases]


def test_no_statement_is_kept_from_the_formatter():
    """Issue 26: statements are laid out by ``ruff format`` (line-length 120), not packed onto one line and
    kept there with the formatter's skip comment; a module that grows past its size is split by responsibility instead."""
    root = Path(__file__).resolve().parents[2]
    marker = "fmt: " + "skip"  # (spelt apart so this file does not match itself)
    found = [
        f"{path.relative_to(root)}:{number}"
        for folder in ("lane_plugin", "tests", "benchmarks", "flows")
        for path in sorted((root / folder).rglob("*.py"))
        if "prefect_suite" not in path.parts
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker in line
    ]
    assert found == [], f"{len(found)} lines kept from the formatter: {found[:10]}"

"""README.md: short, a runnable example early, and its commands are the ones that run.

README's two commands: the first is the install ``.ci/run`` makes and then ``flows/pipeline.py``, the script
``tests/flows/test_pipeline.py`` runs; the second is ``.ci/run``'s test command (reporting-only options aside).
Its python example is the file docs/getting-started.md runs (tests/docs/test_getting_started.py); its lane
commands run here.
"""

from __future__ import annotations

import ast
import re
import shlex

from .blocks import ROOT, blocks, reader_env, run

README = ROOT / "README.md"
CI = (ROOT / ".ci" / "run").read_text()
# pytest options that change what is printed, never which tests run or how
REPORTING = re.compile(r"^(-q+|-v+|-r\w*|--durations(=\d+)?|--durations-min(=[\d.]+)?|-p no:cacheprovider)$")


def commands(block: str) -> list[str]:
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def ci_lines() -> list[str]:
    return [line.strip() for line in CI.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_readme_is_at_most_150_lines_and_reaches_a_runnable_example_by_line_60():
    lines = README.read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    example = next(b for b in blocks(README) if b.lang == "python")
    assert example.line <= 60, example.line
    ast.parse(example.code)
    assert "@lane_task" in example.code and "async def" in example.code and "with gate(" in example.code


def test_the_python_example_is_the_one_getting_started_runs():
    example = next(b for b in blocks(README) if b.lang == "python")
    page = [b for b in blocks(ROOT / "docs" / "getting-started.md") if b.lang == "python"]
    assert example.code == page[0].code and page[0].file_name == "my_flow.py"


def test_the_first_command_is_ci_runs_install_then_the_main_job():
    first = next(b for b in blocks(README) if b.lang == "bash")
    steps = [s.strip() for s in commands(first.code)[0].split("&&")]
    venv, install, job = steps
    assert venv in ci_lines()  # python3 -m venv .venv
    ci_install = next(line for line in ci_lines() if line.startswith(".venv/bin/pip install") and "-e" in line)
    readme_args = [a for a in shlex.split(install) if a != "-q"]
    ci_args = [a for a in shlex.split(ci_install) if a != "-q"]
    # .ci/run may install more extras than README's ([dev,docs]); README's are among them
    extras = lambda args: set(re.search(r"\.\[([\w,-]+)\]", " ".join(args)).group(1).split(","))  # noqa: E731
    assert extras(readme_args) <= extras(ci_args) and readme_args[:3] == ci_args[:3], (install, ci_install)
    assert job == ".venv/bin/python flows/pipeline.py"
    pipeline_test = (ROOT / "tests" / "flows" / "test_pipeline.py").read_text()
    assert "from flows.pipeline import" in pipeline_test and "main(" in pipeline_test
    assert "sys.exit(main())" in (ROOT / "flows" / "pipeline.py").read_text()


def test_the_second_command_is_the_test_command_ci_runs():
    second = [b for b in blocks(README) if b.lang == "bash"][1]
    readme = shlex.split(commands(second.code)[0])
    env = dict(a.split("=", 1) for a in readme if re.match(r"^[A-Z_]+=", a))
    argv = [a for a in readme if not re.match(r"^[A-Z_]+=", a)]
    exported = dict(re.findall(r'^export (LANE_TEST_POSTGRES_URL)="([^"]+)"', CI, re.M))
    assert env == exported
    ci_pytest = [shlex.split(line) for line in ci_lines() if line.startswith(".venv/bin/python -m pytest")]
    assert [[a for a in c if not REPORTING.match(a)] for c in ci_pytest][0] == argv, ci_pytest


def test_the_lane_commands_run(tmp_path):
    lane_blocks = [b for b in blocks(README) if b.lang == "bash" and b.code.startswith("lane ")]
    assert lane_blocks
    env = reader_env(tmp_path)
    for block in lane_blocks:
        p = run(block, tmp_path, env)
        assert p.returncode == 0, (block.code, p.stdout, p.stderr)
    out = run(type(lane_blocks[0])("bash", "lane lanes --json\n", 0), tmp_path, env).stdout
    assert '"burst_tokens": 30000' in out and '"fallback": "paid"' in out and '"lane": "batch"' in out

"""docs/getting-started.md: every code block runs, in order, as a reader's session would run them.

The reader's shell is an empty directory with its own PREFECT_HOME (the default ledger under it, no
LANE_DATABASE_URL) and this venv's ``python`` and ``lane`` first on PATH. The one block not run here is the
first, README's first command (install, then the main job): tests/docs/test_readme.py checks it is README's,
and that its pieces are the install ``.ci/run`` makes and the script ``tests/flows/test_pipeline.py`` runs (a
default run takes about a minute).
"""

from __future__ import annotations

import re

import pytest

from .blocks import ROOT, blocks, reader_env, run

PAGE = ROOT / "docs" / "getting-started.md"
BILL_LINE = r"^(\w+) free (\d+) \d+ (\d+) "  # my_flow.py prints: stage lane jobs estimated actual drift

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]


def readme_first_command() -> str:
    return next(b.code for b in blocks(ROOT / "README.md") if b.lang == "bash")


def test_the_first_block_is_readmes_first_command():
    first = blocks(PAGE)[0]
    assert first.lang == "bash" and first.code == readme_first_command()


def test_every_other_block_runs_in_order_on_a_fresh_default_ledger(tmp_path):
    env = reader_env(tmp_path)
    ran = []
    for block in blocks(PAGE)[1:]:
        p = run(block, tmp_path, env)
        assert p.returncode == 0, (
            f"block at line {block.line} failed:\n{block.code}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        )
        ran.append((block, p.stdout))
    assert len(ran) == 4 and (tmp_path / "my_flow.py").exists()
    assert (tmp_path / ".prefect" / "lane.db").exists()  # the default ledger, nothing else

    # what the reader is told they will see
    flow_out = ran[1][1]
    bill = {m.group(1): (int(m.group(2)), int(m.group(3))) for m in re.finditer(BILL_LINE, flow_out, re.M)}
    assert set(bill) == {"critique", "draft", "polish"} and {jobs for jobs, _ in bill.values()} == {2}, flow_out
    assert all(actual > 0 for _, actual in bill.values()), flow_out  # real usage read from the responses
    assert re.search(r"^free .* ok$", flow_out, re.M) and "lane free: ok" in flow_out
    assert re.search(r"^(critique|draft|polish) +2 ", flow_out, re.M)  # lane report: two jobs per stage
    ledger_out = ran[2][1].splitlines()
    assert "overage=110" in ledger_out[0] and ledger_out[1] == "True"
    cli_out = ran[3][1]
    assert re.search(r"settled \w+ attempt 1: 5120 tokens, overage 120", cli_out)
    assert "burst 30,000 per 1m" in cli_out and "I1-I7 hold" in cli_out

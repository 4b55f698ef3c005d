"""The LaneLedger block and settings in one place (issue 13, item 6)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect import flow

from lane_plugin import DatabaseError, InvalidInput, Ledger, lane_task
from lane_plugin.ledger.url import block_ref, resolve_url

LANE = str(Path(sys.executable).with_name("lane"))


def test_block_references_are_recognised_and_urls_are_not():
    assert block_ref("block:prod") == block_ref("block:lane-ledger/prod") == block_ref("lane-ledger/prod") == "prod"
    assert block_ref("sqlite:///lane-ledger/prod.db") is None and block_ref("lane.db") is None
    with pytest.raises(InvalidInput, match="expected block:NAME"):
        block_ref("block:")


def test_the_collections_entry_point_registers_the_block_in_a_fresh_interpreter():
    code = (
        "from prefect.blocks.core import Block\n"
        "cls = Block.get_block_class_from_key('lane-ledger')\n"  # loads prefect.collections on its own
        "print(cls.__module__, cls.__name__, cls.get_block_type_slug())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["lane_plugin.blocks", "LaneLedger", "lane-ledger"]


def test_settings_are_read_in_one_place_with_the_lane_prefix(monkeypatch, tmp_path):
    from lane_plugin.settings import lane_settings

    monkeypatch.setenv("LANE_DATABASE_URL", f"sqlite:///{tmp_path / 'x.db'}")
    monkeypatch.setenv("LANE_MISSING_USAGE", "fail")
    s = lane_settings()
    assert s.missing_usage == "fail" and "x.db" not in repr(s)  # the URL is a secret: never in a repr
    assert resolve_url() == f"sqlite:///{tmp_path / 'x.db'}"
    monkeypatch.setenv("LANE_MISSING_USAGE", "shrug")
    with pytest.raises(InvalidInput, match="LANE_MISSING_USAGE 'shrug'"):
        lane_settings()


@pytest.mark.usefixtures("prefect_server")
def test_a_saved_block_is_the_ledger_for_the_gate_the_flows_and_the_cli(tmp_path, monkeypatch):
    from prefect.settings import PREFECT_API_URL

    from lane_plugin import blocks
    from lane_plugin.blocks import LaneLedger

    url = f"sqlite:///{tmp_path / 'prod.db'}"
    LaneLedger(url=url).save("t13-prod", overwrite=True)
    blocks._loaded.clear()
    assert "prod.db" not in repr(LaneLedger.load("t13-prod"))  # SecretStr
    assert str(Ledger("block:lane-ledger/t13-prod").url) == url

    @lane_task(stage="draft", estimate=10, ledger="lane-ledger/t13-prod")
    def draft():
        return 12

    @flow
    def f():
        return draft()

    monkeypatch.delenv("LANE_DATABASE_URL", raising=False)
    f()
    assert Ledger(url).lane("free").spent == 12  # the block's ledger, not the default one

    from prefect.flows import load_flow_from_entrypoint

    root = Path(__file__).resolve().parents[2]
    rows = load_flow_from_entrypoint(str(root / "flows/lane_status.py:lane_status"))(db="block:lane-ledger/t13-prod")
    assert {r["lane"]: r for r in rows}["free"]["spent"] == 12

    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), "COLUMNS": "200"}
    env.pop("LANE_DATABASE_URL", None)
    p = subprocess.run(
        [LANE, "lanes", "--json", "--db", "block:lane-ledger/t13-prod"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert '"spent": 12' in p.stdout
    p = subprocess.run(
        [LANE, "--db", "block:lane-ledger/no-such", "lanes"], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 8 and "no block lane-ledger/no-such at" in p.stderr


def test_loading_a_block_without_a_prefect_api_says_so(tmp_path):
    env = {**os.environ, "PREFECT_API_URL": "http://127.0.0.1:9/api", "PREFECT_HOME": str(tmp_path)}
    p = subprocess.run(
        [LANE, "--db", "block:lane-ledger/prod", "lanes"], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 8, p.stderr
    err = [line for line in p.stderr.splitlines() if line.startswith("lane: error:")]
    assert len(err) == 1 and "loading a block needs a Prefect API" in err[0] and "127.0.0.1:9" in err[0]
    assert "Traceback" not in p.stderr
    with pytest.raises(DatabaseError, match="needs a Prefect API"):
        from prefect.settings import PREFECT_API_URL, temporary_settings

        from lane_plugin import blocks

        blocks._loaded.clear()
        with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            blocks.load_url("prod")

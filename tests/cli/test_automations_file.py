"""``lane automations apply``: a bad file or block id is one line naming it, before any Prefect API is asked.

Found by a first-hour user: a YAML typo was a traceback (exit 1, the audit's code), a file that is a
plain list of automations (the shape ``load`` meant to accept) an ``AttributeError``, ``--block-id nope``
blamed ``actions.0.known.DoNothing.type``, and a missing file was said only after ~30 s of starting
the ephemeral server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lane_plugin import automations, cli

REPO_FILE = Path(__file__).resolve().parents[2] / "deployments" / "automations.yaml"
ONE = """- name: lane tail above threshold
  trigger: {type: event, posture: Reactive, expect: [lane.tail.high], threshold: 1, within: 0}
  actions: [{type: do-nothing}]
"""


@pytest.fixture
def no_api(monkeypatch):
    """Any call that would reach the Prefect API (and start a server) fails the test."""

    def refuse(*_a, **_k):
        raise AssertionError("the Prefect API was asked before the input was checked")

    monkeypatch.setattr(automations, "block_document_id", refuse)
    monkeypatch.setattr("prefect.get_client", refuse)


def lane(capsys, *args):
    with pytest.raises(SystemExit) as done:
        cli.main(list(args))
    return done.value.code, capsys.readouterr().err


def test_a_top_level_list_of_automations_loads(tmp_path):
    f = tmp_path / "a.yaml"
    f.write_text(ONE)
    [auto] = automations.load(f, automations.ANY_ID)
    assert auto.name == "lane tail above threshold"


@pytest.mark.parametrize(
    "text, said",
    [
        ("garbage: [\n", "is not valid YAML at line 2"),
        ("hello\n", "holds no automations"),
        ("", "holds no automations"),
        ("automations:\n", "holds no automations"),
    ],
)
def test_a_file_that_is_not_automations_is_one_line_naming_it(tmp_path, capsys, no_api, text, said):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    code, err = lane(capsys, "automations", "apply", "--block", "slack-webhook/x", "--file", str(f))
    assert code == 2, err
    assert err.startswith("lane: error: invalid file") and said in err and "Traceback" not in err, err


def test_a_block_id_that_is_not_a_uuid_is_named(capsys, no_api):
    code, err = lane(capsys, "automations", "apply", "--block-id", "nope", "--file", str(REPO_FILE))
    assert code == 2 and "invalid --block-id 'nope'" in err and "DoNothing" not in err, err


def test_a_missing_file_is_said_before_the_block_is_looked_up(tmp_path, capsys, no_api):
    code, err = lane(capsys, "automations", "apply", "--block", "slack-webhook/x", "--file", str(tmp_path / "no.yaml"))
    assert code == 2 and "not found" in err, err

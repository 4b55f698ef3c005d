"""Every ``lane`` command the README and docs/ show names commands and options that exist, and the how-to
pages' command blocks run as written on a fresh ledger.

Found by an outside review: README's and docs/sharing-a-lane.md's ``lane tenants set free interactive --weight 4``
failed on a fresh lane (a tenant no job has named needs ``--create``).
"""

from __future__ import annotations

import re
import shlex

import pytest
import typer

from lane_plugin.cli import app, hoist_db

from .blocks import ROOT, blocks, reader_env, run

try:  # newer typer vendors its own click; older ones use click itself
    from typer import _click as click
except ImportError:  # pragma: no cover - depends on the installed typer
    import click

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# a synopsis, not a command: a placeholder (LANE, JOB, <job>), an optional part, a choice, a shell variable
SYNOPSIS = re.compile(r"^[A-Z][A-Z_|]*$|[\[\]<>|$]|\.\.\.|…")


def lane_commands(text: str) -> list[str]:
    """``lane ...`` lines of the page's shell blocks and its inline code, comments and pipes cut."""
    found = []
    for b in blocks(text):
        if b.lang in ("bash", "sh", "shell", "console", ""):
            found += [line.strip().removeprefix("$ ") for line in b.code.splitlines()]
    found += re.findall(r"`(lane [^`]+)`", text)
    out = []
    for line in found:
        if line.startswith("lane "):
            out.append(re.split(r"\s+#|\s[|;&>]|\$\(", line)[0].strip())
    return out


def parse(args: list[str]) -> None:
    """Parse ``lane ARGS`` as the CLI would, down to its last subcommand, running nothing."""
    cmd = typer.main.get_command(app)
    ctx = cmd.make_context("lane", hoist_db(list(args)))
    while hasattr(cmd, "resolve_command"):
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        if not rest:
            return
        name, cmd, rest = cmd.resolve_command(ctx, rest)
        ctx = cmd.make_context(name, rest, parent=ctx)


def test_every_command_and_option_the_docs_show_exists():
    wrong, seen = [], 0
    for page in PAGES:
        for line in lane_commands(page.read_text()):
            args = shlex.split(line)[1:]
            if any(SYNOPSIS.search(a) for a in args):
                continue
            seen += 1
            try:
                parse(args)
            except click.exceptions.NoSuchOption as exc:
                wrong.append(f"{page.relative_to(ROOT)}: {line}: {exc.format_message()}")
            except click.exceptions.UsageError as exc:
                if "No such command" in exc.format_message():
                    wrong.append(f"{page.relative_to(ROOT)}: {line}: {exc.format_message()}")
            except Exception:  # noqa: BLE001 - --help's exit, a missing argument: the names exist
                pass
    assert seen > 100  # the pages were read
    assert wrong == []


def test_a_misspelt_option_in_a_page_would_be_found():
    with pytest.raises(click.exceptions.NoSuchOption):
        parse(["tenants", "set", "free", "interactive", "--weigth", "4"])
    with pytest.raises(click.exceptions.UsageError, match="No such command"):
        parse(["lanes", "sett", "free"])


@pytest.mark.parametrize("page", ["sharing-a-lane.md", "provider-limits.md"])
def test_the_how_to_command_blocks_run_as_written_on_a_fresh_ledger(tmp_path, page):
    env = reader_env(tmp_path)
    ran = 0
    for block in blocks(ROOT / "docs" / page):
        lines = [x for x in block.code.splitlines() if x.strip() and not x.lstrip().startswith("#")]
        if block.lang == "bash" and lines and all(x.startswith("lane ") for x in lines):
            p = run(block, tmp_path, env)
            assert p.returncode == 0, (page, block.code, p.stdout, p.stderr)
            ran += 1
    assert ran >= 1

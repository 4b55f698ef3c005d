"""Fenced code blocks of a markdown page, and running them as a reader would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # where the block starts in its page, for messages

    @property
    def file_name(self) -> str | None:
        """A python block whose first line is ``# NAME.py`` is that file, for a later block to run."""
        first = self.code.splitlines()[0] if self.code else ""
        match = re.fullmatch(r"# ([\w-]+\.py)", first.strip())
        return match.group(1) if match else None


def blocks(page: Path | str) -> list[Block]:
    """Every fenced block of the page, in order (indented fences included: a list item's block)."""
    text = Path(page).read_text() if isinstance(page, Path) else page
    out = []
    for match in re.finditer(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", text, re.M | re.S):
        indent = len(match.group(1))
        code = "\n".join(line[indent:] for line in match.group(3).splitlines()) + "\n"
        out.append(Block(match.group(2), code, text.count("\n", 0, match.start()) + 1))
    return out


def reader_env(home: Path) -> dict[str, str]:
    """A reader's shell: this venv's ``python`` and ``lane`` first on PATH, a private PREFECT_HOME, the default
    ledger under it (no LANE_DATABASE_URL), no Prefect server to find (the ephemeral one starts)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANE_", "PREFECT_"))}
    bin_dir = str(Path(sys.executable).parent)
    env.update(
        PATH=bin_dir + os.pathsep + env.get("PATH", ""),
        PREFECT_HOME=str(home / ".prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="90",
        PYTHONPATH="",
    )
    return env


def run(block: Block, cwd: Path, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """Run one block: bash with ``set -euo pipefail`` (every line must succeed), python as a script; a python
    block that names its file is written there instead, for a later bash block to run."""
    if block.lang == "python":
        if block.file_name:
            (cwd / block.file_name).write_text(block.code)
            return subprocess.CompletedProcess([], 0, "", "")
        cmd = [sys.executable, "-c", block.code]
    elif block.lang in ("bash", "sh", "console", "shell"):
        cmd = ["bash", "-c", "set -euo pipefail\n" + block.code]
    else:
        raise ValueError(f"a {block.lang or 'plain'} block at line {block.line} cannot be run")
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)

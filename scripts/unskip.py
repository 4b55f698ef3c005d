"""Remove `# fmt: skip` markers from files, run ruff format on them, and prove the AST is unchanged.

Usage: python unskip.py [--dry] FILE...
Prints per file: markers removed, lines before -> after, and comment lines whose neighbourhood moved.
Exits non-zero (and restores the file) if the AST differs or a comment was lost.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

RUFF = "/work/main/.venv/bin/ruff"
MARK = re.compile(r"[ \t]*# fmt: skip(?=[ \t]*(#|$))", re.M)


def comments(src: str) -> list[str]:
    return [t.string for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT]


def unskip(path: Path, dry: bool) -> bool:
    old = path.read_text()
    n = len(MARK.findall(old))
    if not n:
        return True
    stripped = MARK.sub("", old)
    # "x  # fmt: skip  # why" -> "x  # why" keeps the two-space gap from what followed
    path.write_text(stripped)
    subprocess.run([RUFF, "format", "-q", str(path)], check=True)
    new = path.read_text()
    ok = ast.dump(ast.parse(old)) == ast.dump(ast.parse(new))
    c_old = sorted(c for c in comments(old) if c != "# fmt: skip")
    c_new = sorted(comments(new))
    ok_c = c_old == c_new
    lines_old, lines_new = len(old.splitlines()), len(new.splitlines())
    flag = "" if lines_new <= 450 else "  OVER 450"
    print(f"{path}: {n} markers, {lines_old} -> {lines_new} lines, ast {'same' if ok else 'DIFFERS'}, "
          f"comments {'same' if ok_c else 'DIFFER'}{flag}")
    if not ok_c:
        print("   lost:", sorted(set(c_old) - set(c_new)), "new:", sorted(set(c_new) - set(c_old)))
    if dry or not (ok and ok_c):
        path.write_text(old)
    return ok and ok_c


def main(argv: list[str]) -> int:
    dry = "--dry" in argv
    files = [Path(a) for a in argv if a != "--dry"]
    return 0 if all([unskip(f, dry) for f in files]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

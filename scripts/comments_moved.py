"""Compare where comments sit in two versions of a file (old from git, new on disk).

Usage: python comments_moved.py REV FILE...   Prints each comment whose line's code changed: old code | new code.
"""

from __future__ import annotations

import io
import subprocess
import sys
import tokenize


def placed(src: str) -> list[tuple[str, str]]:
    lines = src.splitlines()
    out = []
    for t in tokenize.generate_tokens(io.StringIO(src).readline):
        if t.type == tokenize.COMMENT and t.string != "# fmt: skip":
            code = lines[t.start[0] - 1][: t.start[1]].strip()
            out.append((t.string, code))
    return out


def main(rev: str, files: list[str]) -> None:
    for f in files:
        old = subprocess.run(["git", "show", f"{rev}:{f}"], capture_output=True, text=True, check=True).stdout
        new = open(f).read()
        a, b = placed(old), placed(new)
        if [c for c, _ in a] != [c for c, _ in b]:
            print(f"{f}: comment ORDER changed")
        for (c, oc), (_, nc) in zip(a, b):
            if oc != nc and (oc or nc):
                print(f"{f}: {c[:70]}\n    old: {oc[:110]}\n    new: {nc[:110]}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])

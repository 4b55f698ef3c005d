"""Functions a hostile lane row names (``module:function``) in test_preflight.py.

Before issue 10 item 9 a row could name any importable function and every ticking process ran it;
now only registered checks run. ``touch`` writes ``$LANE_TEST_PREFLIGHT_MARKER``: proof that a
row's text became code execution.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def touch() -> bool:
    Path(os.environ.get("LANE_TEST_PREFLIGHT_MARKER", "/nonexistent/marker")).write_text("ran")
    return True


def slow() -> bool:
    time.sleep(15)
    return True


def exits() -> bool:
    sys.exit(3)


def interrupt() -> bool:
    raise KeyboardInterrupt("operator pressed ^C inside the check")


def up() -> bool:
    return True


def down() -> bool:
    return False

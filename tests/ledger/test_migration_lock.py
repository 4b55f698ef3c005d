"""The SQLite ledger's migration lock: beside the ledger, removed once done, and still one migrator at a time.

Before issue 25 every SQLite ledger left a ``lane-ledger-*.migrate.lock`` file in the system temporary
directory for good (30 after an afternoon of tests). The lock now lives beside the ledger and its holder
removes it; removing a lock file that others wait on is only safe with the re-check in
:func:`lane_plugin.ledger.schema.file_lock`, which the contention test below drives through that race.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from lane_plugin import Ledger
from lane_plugin.ledger.schema import HEAD_REVISION, migration_lock_path

# A worker: waits for the go file, then takes the lock ROUNDS times, logging when it is in and out.
# It counts how often it opened the lock path (more opens than rounds: it found the file it had
# waited on removed, and took the lock on the new one instead).
LOCKER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from lane_plugin.ledger import schema

    path, log, go, rounds = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), int(sys.argv[4])
    opens = 0
    real_open = os.open

    def counting_open(p, *args, **kwargs):
        global opens
        if str(p) == str(path):
            opens += 1
        return real_open(p, *args, **kwargs)

    os.open = counting_open
    while not go.exists():
        time.sleep(0.001)
    fd = real_open(log, os.O_WRONLY | os.O_APPEND)
    for _ in range(rounds):
        with schema.file_lock(path):
            os.write(fd, f"in {os.getpid()}\\n".encode())
            time.sleep(0.002)
            os.write(fd, f"out {os.getpid()}\\n".encode())
        time.sleep(0.0005)
    print(opens - rounds)
""")

# A process using a ledger for the first time, at the same instant as others; it says whether it took
# the migration lock (saw the schema missing or old) and the revision it found.
FIRST_USE = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from lane_plugin import Ledger
    from lane_plugin.ledger import schema

    url, go = sys.argv[1], Path(sys.argv[2])
    took = []
    real_lock = schema.file_lock

    def noting_lock(path):
        took.append(str(path))
        return real_lock(path)

    schema.file_lock = noting_lock
    while not go.exists():
        time.sleep(0.001)
    led = Ledger(url)
    lanes = [row["lane"] for row in led.lanes()]
    print(json.dumps({"took": took, "revision": led.db.revision(), "lanes": lanes}))
""")


def spawn(code: str, *args: str, tmpdir: Path) -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(tmpdir)}  # what the process would leave in "the temp directory" lands here
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def finish(procs: list[subprocess.Popen]) -> list[str]:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(out)
    return outs


def test_the_lock_is_beside_the_ledger_not_in_the_temp_directory(tmp_path):
    ledger = tmp_path / "sub dir" / "lane.db"
    assert migration_lock_path(str(ledger)) == Path(os.path.realpath(ledger) + ".migrate.lock")
    link = tmp_path / "link.db"
    link.symlink_to(ledger)
    assert migration_lock_path(str(link)) == migration_lock_path(str(ledger))  # one ledger, one lock


def test_first_use_leaves_no_lock_file_beside_the_ledger_or_in_the_temp_directory(tmp_path):
    temp, home = tmp_path / "temp", tmp_path / "home"
    temp.mkdir()
    home.mkdir()
    url = f"sqlite:///{home / 'lane.db'}"
    go = tmp_path / "go"
    go.touch()
    (out,) = finish([spawn(FIRST_USE, url, str(go), tmpdir=temp)])
    seen = json.loads(out)
    assert seen["took"] == [str(home / "lane.db.migrate.lock")]  # it migrated, under the lock beside the ledger
    assert seen["revision"] == HEAD_REVISION
    assert list(temp.iterdir()) == []
    assert sorted(p.name for p in home.iterdir() if not p.name.startswith("lane.db-")) == ["lane.db"]  # (-wal, -shm)


def test_an_upgrade_in_this_process_removes_its_lock_too(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")
    assert led.upgrade() == HEAD_REVISION
    assert led.lanes()
    assert not migration_lock_path(str(tmp_path / "lane.db")).exists()


def test_concurrent_first_uses_of_one_fresh_ledger_migrate_it_once_and_leave_no_lock(tmp_path):
    temp = tmp_path / "temp"
    temp.mkdir()
    url = f"sqlite:///{tmp_path / 'lane.db'}"
    go = tmp_path / "go"
    procs = [spawn(FIRST_USE, url, str(go), tmpdir=temp) for _ in range(6)]
    time.sleep(3.0)  # let them all import and wait at the start line
    go.touch()
    seen = [json.loads(out) for out in finish(procs)]
    assert all(s["revision"] == HEAD_REVISION and s["lanes"] == ["free", "paid"] for s in seen), seen
    # the race happened: several processes found no schema and queued for the lock (had they migrated
    # at once, Alembic would have failed creating tables that exist, and a process exited non-zero)
    assert sum(bool(s["took"]) for s in seen) >= 2, seen
    assert not migration_lock_path(str(tmp_path / "lane.db")).exists()
    assert list(temp.iterdir()) == []
    assert Ledger(url).audit() == []


def test_a_removed_lock_file_never_lets_two_processes_in_at_once(tmp_path):
    """Every holder removes the lock file while others wait on it; still no two holders overlap."""
    path, log, go = tmp_path / "x.migrate.lock", tmp_path / "log", tmp_path / "go"
    log.touch()
    rounds, workers = 40, 4
    procs = [spawn(LOCKER, str(path), str(log), str(go), str(rounds), tmpdir=tmp_path) for _ in range(workers)]
    time.sleep(2.0)
    go.touch()
    reopened = sum(int(out) for out in finish(procs))
    events = log.read_text().split("\n")[:-1]
    assert len(events) == 2 * rounds * workers
    holder = None
    for event in events:  # strictly in, out, in, out ..., each out by the process that went in
        kind, pid = event.split()
        if kind == "in":
            assert holder is None, f"{pid} went in while {holder} held the lock"
            holder = pid
        else:
            assert holder == pid, f"{pid} left a lock {holder} held"
            holder = None
    assert reopened > 0  # waiters did find the file they waited on removed (the race the re-check guards)
    assert not path.exists()

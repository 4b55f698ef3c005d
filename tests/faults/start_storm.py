"""Prefect's delivery, at random: a thread raises into a starter thread (``PyThreadState_SetAsyncExc``, as Prefect's
timeout enforcer does) at a random moment while the starter starts a helper thread, round after round.

    python tests/faults/start_storm.py thread 3000   # threading.Thread.start(): the starter hangs within a few rounds
    python tests/faults/start_storm.py spawn 3000    # lane_plugin.ledger.spawn.spawn(): no hang, nothing lost

Prints the rounds, where the exception landed (in the starter, or after the start), the threads that ran, and
(on a hang) every thread's stack (faulthandler). ``kill -USR1`` dumps the stacks at any time. The deterministic
test is tests/faults/test_spawn.py.
"""

from __future__ import annotations

import _thread
import ctypes
import faulthandler
import random
import signal
import sys
import threading
import time


class Injected(BaseException):
    pass


def main(mode: str, rounds: int, max_delay: float = 0.0004) -> int:
    faulthandler.register(signal.SIGUSR1)
    from lane_plugin.ledger.spawn import Spawned, spawn

    ran: list[int] = []
    stats = {"in the start": 0, "after it": 0, "returned": 0}
    state = {"in": False, "done": 0}

    def target() -> None:
        ran.append(1)

    def start_one() -> None:
        if mode == "thread":
            threading.Thread(target=target, daemon=True).start()
        else:
            spawn(Spawned("storm"), target)

    go = _thread.allocate_lock()
    go.acquire()

    def starter() -> None:
        while True:
            try:
                go.acquire()
            except Injected:  # sent as the last round ended: it landed here, the lock taken
                stats["after it"] += 1
            state["in"] = True
            try:
                start_one()
                time.sleep(0.0005)
                outcome = "returned"
            except Injected:
                outcome = "in the start"
            while True:  # one that lands after the window lands here
                try:
                    time.sleep(0.002)
                    break
                except Injected:
                    stats["after it"] += 1
            state["in"] = False
            stats[outcome] += 1
            state["done"] += 1

    ident = _thread.start_new_thread(starter, ())
    rng = random.Random(1)
    for i in range(rounds):
        done = state["done"]
        go.release()
        t0 = time.monotonic()
        while not state["in"] and state["done"] == done and time.monotonic() - t0 < 5:
            time.sleep(0)
        if not state["in"]:
            continue  # the round ended before it was seen: nothing sent
        end = time.perf_counter() + rng.uniform(0, max_delay)
        while time.perf_counter() < end:
            pass
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(Injected))
        t0 = time.monotonic()
        while state["done"] == done and time.monotonic() - t0 < 5:
            time.sleep(0.001)
        if state["done"] == done:
            print(f"{mode}: the starter HUNG in round {i + 1} ({stats}, threads ran {len(ran)}):", flush=True)
            faulthandler.dump_traceback()
            return 1
    print(f"{mode}: {rounds} rounds, no hang; exception raised {stats}; threads ran {len(ran)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 3000))

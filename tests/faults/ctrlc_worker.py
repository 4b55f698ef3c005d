"""A Prefect flow whose gated LLM call is cut short by Ctrl-C: ``python ctrlc_worker.py URL LANE``.

``PREFECT_API_URL`` names the server. The flow calls one ``lane_task`` (estimate 500) in its own thread, the
main one (a sync task called from a flow runs there, where Python raises ``KeyboardInterrupt``): the body
reports 100 tokens (a first LLM call came back), prints ``in-call`` and sleeps 30 s (the second call). The test
sends SIGINT, as a terminal's Ctrl-C does. The worker prints ``interrupted <exception>`` when the interrupt came
out of the flow and exits 0; anything else exits otherwise, a fatal error with every thread's stack on stderr.
"""

from __future__ import annotations

import faulthandler
import sys
import time


def main(url: str, lane: str) -> None:
    faulthandler.enable(all_threads=True)  # a crash of the process itself shows where every thread was
    from prefect import flow

    from lane_plugin import lane_task, report_usage

    @lane_task(stage="ctrl-c", estimate=500, lane=lane, ledger=url)
    def long_call() -> dict:
        report_usage(100)
        print("in-call", flush=True)
        time.sleep(30.0)
        return {"usage": {"total_tokens": 900}}

    @flow(name="interrupted")
    def interrupted() -> None:
        long_call()

    try:
        interrupted()
    except KeyboardInterrupt as exc:
        print(f"interrupted {type(exc).__name__}", flush=True)
        return
    print("finished: the interrupt never reached the flow", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(*sys.argv[1:])

"""flows/pipeline.py, the README's first command: it gates every stage in a lane it outgrows, so its output shows
waits, a refusal with its reason and a fallback to ``paid``; its bill says so and its drift report finds the critique."""

from __future__ import annotations

import re

import pytest

from ..tables import job_rows

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]


def test_the_main_job_shows_waits_a_refusal_and_a_fallback_and_its_bill_says_so(ledger, capsys):
    from flows.pipeline import APPENDIX_CHARS, DEMO_LANE, LocalModel, documents, main

    docs = 12
    assert main(["--docs", str(docs), "--seed", "3", "--db", ledger.url.raw]) == 0
    out = capsys.readouterr().out

    # a wait: jobs of the demo lane were held for the burst window / the lease cap / the ceiling
    jobs = job_rows(ledger)
    waits = [j["admitted_at"] - j["created_at"] for j in jobs if j["admitted_at"] is not None]
    assert max(waits) >= 0.2, sorted(waits)[-5:]
    shown = re.search(r"waits: up to (\d+\.\d+)s", out)
    assert shown and float(shown.group(1)) >= 0.2, out

    # one refusal, with its reason: the appendix asks for more than the lane's burst, and no job of it was written
    assert len(documents(docs, 3)[-1]) >= APPENDIX_CHARS
    refused = re.findall(r"refused: document (\d+): (.*)", out)
    assert [int(n) for n, _ in refused] == [docs - 1], out
    assert "refused at intake in lane 'demo'" in refused[0][1] and "exceeds the lane's burst of 6000" in refused[0][1]
    assert len(jobs) == 3 * (docs - 1) and {j["state"] for j in jobs} == {"done"}

    # a fallback: the demo lane ran out of room, later stages were admitted (and billed) in paid
    fell = [j for j in jobs if j["lane"] == "paid"]
    assert fell and {j["stage"] for j in fell} <= {"critique", "final"}
    assert f"fallback: {len(fell)} jobs" in out and "went to lane 'paid'" in out
    demo, paid = ledger.lane(DEMO_LANE), ledger.lane("paid")
    assert demo.spent + demo.reserved <= demo.ceiling + demo.overage and paid.spent > 0

    # the bill says so: a line per stage and lane, paid among them, adding up to what the lanes were billed
    bill = out[out.index("Bill of this run") : out.index("Lane status")]
    assert re.search(r"^\s*final\s+paid\s", bill, re.M) and re.search(r"^\s*draft\s+demo\s", bill, re.M), bill
    assert sum(j["actual"] for j in jobs) == demo.spent + paid.spent

    # the drift report still finds the underestimated critique; the lane status reads in percent
    drift_table = out[out.index("Drift report (this run)") :]
    assert re.search(r"^critique .* overspends", drift_table, re.M) and re.search(
        r"^draft .* honest", drift_table, re.M
    )
    assert all(len(line) <= 100 for line in drift_table.splitlines()), drift_table
    assert re.search(r"^demo\s.*\s\d+\.\d%\s", out, re.M), out
    assert {j["est_version"] for j in jobs} == {"chars4-v1"} and len({j["run_key"] for j in jobs}) == 1
    assert LocalModel(seed=3).complete("x", stage="draft") == LocalModel(seed=3).complete("x", stage="draft")
    assert ledger.audit() == []


def test_a_second_run_on_the_same_ledger_gets_the_same_room(ledger):
    from flows.pipeline import DEMO_LANE, ROOM_PER_DOC, give_room

    assert give_room(ledger, 4) == 4 * ROOM_PER_DOC
    first = ledger.lane(DEMO_LANE)
    assert (first.ceiling, first.fallback, first.max_leased) == (4 * ROOM_PER_DOC, "paid", 4)
    job = ledger.submit("draft", 1_000, DEMO_LANE)
    [lease] = ledger.tick(DEMO_LANE)
    ledger.settle(lease, 1_500)  # spent, and 500 over its estimate
    give_room(ledger, 4)
    again = ledger.lane(DEMO_LANE)
    assert again.ceiling - again.spent - again.reserved == 4 * ROOM_PER_DOC and ledger.job(job)["state"] == "done"

"""Independent reads of the ledger's tables for tests: own SQL, not the library's reports."""

from __future__ import annotations

# The article's drift query, verbatim: drift() must agree with it on the same ledger.
ARTICLE_SQL = """select stage,
       count(*)                as jobs,
       sum(est)                as est_tokens,
       sum(actual)             as actual_tokens,
       round(1.0*sum(actual)/nullif(sum(est),0), 2) as drift
from job where state='done'
group by stage"""


def job_rows(ledger, where: str = "1 = 1", params: dict | None = None) -> list[dict]:
    cols, rows = ledger.rows(f"select * from job where {where} order by created_at, id", params)
    return [dict(zip(cols, r)) for r in rows]


def settlements(ledger) -> list[dict]:
    cols, rows = ledger.rows("select * from settlement order by settled_at, job_id, attempt")
    return [dict(zip(cols, r)) for r in rows]

"""Lane status: counters, remaining room and queue sizes, as people read them."""

from __future__ import annotations

from .db import Cursor
from .lanes import all_lanes


def lane_status(cur: Cursor, now: float) -> list[dict]:
    counts: dict[tuple[str, str], int] = {
        (r[0], r[1]): r[2]
        for r in cur.all("select lane, state, count(*) from job where state in ('new', 'parked') group by lane, state")
    }
    out = []
    for row in all_lanes(cur):
        committed = row.spent + row.reserved
        out.append(
            {
                "lane": row.name,
                "allowance": row.allowance,
                "ceiling": row.ceiling,
                "spent": row.spent,
                "reserved": row.reserved,
                "remaining": row.ceiling - committed,
                "overage": row.overage,
                "pct_of_ceiling": round(100.0 * committed / row.ceiling, 2),
                "start_limit": row.policy.start_limit,
                "leased": row.leased,
                "max_leased": row.max_leased,
                "waiting": counts.get((row.name, "new"), 0),
                "parked": counts.get((row.name, "parked"), 0),
                "burst_tokens": row.burst_tokens,
                "window_seconds": row.window_seconds,
                "lease_seconds": row.lease_seconds,
                "max_wait_seconds": row.max_wait_seconds,
                "max_attempts": row.max_attempts,
                "fallback": row.fallback,
                "period": row.period,
                "stopped": row.stopped,
                "hard_stopped": row.hard_stopped,
                "starting_stopped": committed >= row.policy.start_limit,
                "preflight": row.preflight,
                "preflight_ok": row.preflight_ok,
                "preflight_error": row.preflight_error,
                "preflight_at": row.preflight_at,
            }
        )
    return out

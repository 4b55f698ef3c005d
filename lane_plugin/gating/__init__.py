"""The Prefect gate: ``@lane_task``, ``gate()`` and ``report_usage()``.

A gated body is admitted against its lane's budget, holds a renewed lease while
it runs and settles what it really spent; the modules here are the decorator,
the gate itself, lease renewal, usage capture, Prefect events and artifacts.
"""

from .context import Gate, gate
from .current import current_gate, report_usage, track_usage
from .decorator import lane_task
from .ledgers import get_ledger
from .tracking import track_limits
from .usage import NO_USAGE

__all__ = [
    "NO_USAGE",
    "Gate",
    "current_gate",
    "gate",
    "get_ledger",
    "lane_task",
    "report_usage",
    "track_limits",
    "track_usage",
]

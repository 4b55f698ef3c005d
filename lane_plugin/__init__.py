"""lane_plugin: admit LLM pipeline stages against a token budget, not a job count.

``Ledger`` is the token ledger (:mod:`lane_plugin.ledger`); ``lane_task``,
``gate``, ``report_usage``, ``track_usage``, ``track_limits``, ``current_gate``, ``Gate`` and ``NO_USAGE`` are the Prefect gate
(:mod:`lane_plugin.gating`), imported on first use so that the ``lane`` CLI
never pays for importing Prefect. docs/architecture.md maps the package.
"""

from typing import TYPE_CHECKING, Any

from .errors import (
    AmbiguousAttempt,
    ConflictingReplay,
    DatabaseError,
    InvalidInput,
    JobParked,
    LaneError,
    LeaseLost,
    NeverFits,
    NoLedger,
    NotALedger,
    NotLeased,
    NotParked,
    UnknownJob,
    UnknownLane,
    UnknownRevision,
    UnknownTenant,
    UsageMissing,
)
from .ledger import Lease, Ledger, Settled
from .ledger.preflight import register_preflight, unregister_preflight

if TYPE_CHECKING:  # type checkers see the gate's names; at run time they are imported on first use
    from .gating import NO_USAGE, Gate, gate, lane_task, report_usage, track_limits, track_usage

__version__ = "0.1.0"

_GATING = ("lane_task", "gate", "report_usage", "track_usage", "track_limits", "current_gate", "Gate", "NO_USAGE")


def __getattr__(name: str) -> Any:
    if name in _GATING:
        from . import gating

        return getattr(gating, name)
    raise AttributeError(f"module 'lane_plugin' has no attribute {name!r}")


__all__ = [
    "AmbiguousAttempt",
    "ConflictingReplay",
    "DatabaseError",
    "InvalidInput",
    "JobParked",
    "LaneError",
    "Lease",
    "LeaseLost",
    "Ledger",
    "NeverFits",
    "NoLedger",
    "NotALedger",
    "NotLeased",
    "NotParked",
    "Settled",
    "UnknownJob",
    "register_preflight",
    "unregister_preflight",
    "UnknownLane",
    "UnknownRevision",
    "UnknownTenant",
    "UsageMissing",
    "__version__",
    # _GATING: imported on first use
    "lane_task",
    "gate",
    "report_usage",
    "track_usage",
    "track_limits",
    "Gate",
    "NO_USAGE",
]

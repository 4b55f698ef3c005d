"""lane_plugin: admit LLM pipeline stages against a token budget, not a job count.

``Ledger`` is the token ledger; ``lane_task``, ``gate`` and ``report_usage``
(the Prefect gate) are imported lazily so that the ``lane`` CLI never pays for
importing Prefect.
"""

from .errors import (
    ConflictingReplay,
    DatabaseError,
    InvalidInput,
    JobParked,
    LaneError,
    LeaseLost,
    NeverFits,
    NotALedger,
    NotLeased,
    UnknownJob,
    UnknownLane,
)
from .ledger import Ledger
from .store import Lease, Settled

__version__ = "0.1.0"

_GATE = ("lane_task", "gate", "report_usage", "Gate")


def __getattr__(name: str):
    if name in _GATE:
        # The submodule lane_plugin.gate and the function gate() share a name: importing the
        # module binds it here, so rebind the public names (the function wins) and cache them.
        import importlib

        module = importlib.import_module(".gate", __name__)
        task_module = importlib.import_module(".gated_task", __name__)
        globals().update({n: getattr(module, n) for n in _GATE if n != "lane_task"})
        globals()["lane_task"] = task_module.lane_task
        return globals()[name]
    raise AttributeError(f"module 'lane_plugin' has no attribute {name!r}")


__all__ = [
    "ConflictingReplay", "DatabaseError", "InvalidInput", "JobParked", "LaneError", "Lease",
    "LeaseLost", "Ledger", "NeverFits", "NotALedger", "NotLeased", "Settled", "UnknownJob",
    "UnknownLane", "__version__", *_GATE,
]  # fmt: skip

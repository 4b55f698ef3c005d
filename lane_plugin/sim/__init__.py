"""``lane simulate``: the ledger's own admission policy and baselines on a simulated clock.

``engine`` runs one lane and one slow worker; ``policies`` holds the policies it
compares; ``traffic`` reads traces and generates runs; ``results`` and
``report`` say what happened; ``command`` is the CLI command.
"""

from .engine import PERIODS, Sim, SimConfig, refused_at_intake, simulate
from .policies import POLICIES
from .results import SimResult, percentile
from .traffic import MIXES, Trace, from_ledger, generate, load_csv, write_csv

__all__ = [
    "MIXES", "PERIODS", "POLICIES", "Sim", "SimConfig", "SimResult", "Trace", "from_ledger", "generate",
    "load_csv", "percentile", "refused_at_intake", "simulate", "write_csv",
]  # fmt: skip

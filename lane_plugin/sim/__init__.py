"""``lane simulate``: the ledger's own admission policy and baselines on a simulated clock.

``engine`` runs one lane and one slow worker (``config`` says which);
``policies`` holds the policies it compares, ``window`` the sliding burst
window they all obey, ``meter`` what a sliding limit would have refused;
``traffic`` generates runs, ``readers`` reads trace files; ``chains`` chains
the stages of a run; ``results`` and ``report`` say what happened;
``progress`` draws a bar on stderr; ``command`` is the CLI command.
"""

from .config import PERIODS, SimConfig, refused_at_intake
from .engine import Sim, simulate
from .policies import POLICIES
from .readers import load_csv, load_trace, write_csv
from .results import SimResult, percentile
from .traffic import MIXES, Trace, from_ledger, generate
from .window import RateWindow

__all__ = [
    "MIXES",
    "PERIODS",
    "POLICIES",
    "Sim",
    "SimConfig",
    "RateWindow",
    "SimResult",
    "Trace",
    "from_ledger",
    "generate",
    "load_csv",
    "load_trace",
    "percentile",
    "refused_at_intake",
    "simulate",
    "write_csv",
]

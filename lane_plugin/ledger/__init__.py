"""The token ledger: the only part of lane_plugin that talks to the database.

:class:`Ledger` is its public face; the modules below it each own one kind of
write (intake, admission, settlement, upkeep, lane rows) or read (status,
audit, reads), all in plain DB-API SQL so that the CLI starts fast.
"""

from .api import Ledger
from .bill import BillLine
from .jobs import Lease, Settled
from .waiting import wait_and_acquire

__all__ = ["BillLine", "Ledger", "Lease", "Settled", "wait_and_acquire"]

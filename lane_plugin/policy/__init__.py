"""The admission policy, pure: which waiting jobs a lane leases now (see :mod:`.admission`)."""

from .admission import *  # noqa: F403  (transitional: the package's own names come in the next commit)
from .admission import _rule  # noqa: F401

"""Rule 12's exact per-job form: each waiting job's own count of what passed it (the ledger's and the simulator's).

Rule 12 (:mod:`lane_plugin.policy.overtake`, :mod:`lane_plugin.policy.slack`) proves ``O_K <= key_K`` for every job
K, ``O_K`` the rate tokens of younger jobs admitted while K waits, but reads it through two index heads: ``passed``
(counted from the oldest waiting job) against the least key, and ``left`` against the least due. Both are lane-wide
upper bounds on ``O_K``, so a pass can be refused though every waiting job has room for it. This form keeps the
proof's own quantity instead: the store keeps, per waiting job, its *room* ``key_K - O_K``; a pass of job X with rate
``r`` is allowed while every waiting job older than X keeps ``room >= r`` after it (a younger job is not passed by
X). Then ``O_K <= key_K`` holds for every job as rule 12 needs, so its bound ``T_K <= V_K + key_K`` and the quantile
bound built on it stand unchanged; the order refuses a pass only when some job it passes has no room.

One index head per job does not give this: an admission changes the room of every older waiting job (a range
update). Kept per arrival *epoch* it is bounded work: one counter per epoch with a waiting job, its least room
the head of an index on ``(epoch, base)``, and at most a few epochs' rows read or written one by one, the same
rooms exactly. The ledger keeps them so (:mod:`lane_plugin.ledger.overtake`, a lane's ``overtake_slack``); the
simulator in a segment tree or the same epochs (:mod:`lane_plugin.sim.rooms`, tests/sim/test_rooms.py).

**What the store gives** (:class:`Rooms`): each waiting job's *position* (its arrival number: older jobs have
smaller ones) and the least room over the waiting jobs in a range of positions, as it stood when the tick began.
Within a tick, :func:`least_room` accounts for what the tick already did: the jobs admitted or left (their room no
longer binds; each splits the range of older jobs into pieces) and the rate admitted this tick ahead of each piece.

tests/policy/test_perjob.py checks the bound for every job on random traffic with tenants (hypothesis).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .candidate import Candidate


class Rooms(Protocol):
    """The waiting jobs' rooms (``key - O``) by arrival position, as the store held them at the tick's start."""

    def position(self, job_id: str) -> int | None:
        """The arrival position of waiting job ``job_id`` (None: not waiting)."""

    def least(self, lo: int, hi: int) -> int | None:
        """The least room of the waiting jobs with ``lo <= position < hi`` (None: no job waits there)."""


def least_room(rooms: Rooms, position: int, done: Sequence[int], taken: Sequence[tuple[int, int]]) -> int | None:
    """The least room left, after this tick's admissions, among the jobs still waiting older than ``position``.

    ``done``: the positions of the jobs admitted or left this tick, ascending; ``taken``: ``(position, rate)`` of
    those admitted. A job K older than ``position`` and not done has had every job of ``taken`` younger than it
    pass it this tick (``O_K`` grew by their rates); the jobs of ``done`` cut the older range into pieces with the
    same younger admissions each. None: no job older than ``position`` waits (the candidate passes nobody).

    Example:
        >>> class R:
        ...     rooms = {0: 50, 1: 900, 2: 400}
        ...     def position(self, jid): return int(jid)
        ...     def least(self, lo, hi):
        ...         v = [r for p, r in self.rooms.items() if lo <= p < hi]
        ...         return min(v) if v else None
        >>> least_room(R(), 3, (), ()), least_room(R(), 3, (0,), ((0, 100),)), least_room(R(), 0, (), ())
        (50, 400, None)
        >>> least_room(R(), 3, (2,), ((2, 30),))   # 2 went: 0 and 1 were passed by its 30 this tick
        20
    """
    least: int | None = None
    lo = 0
    for end in [*done[: bisect_left(done, position)], position]:
        if lo < end:
            room = rooms.least(lo, end)
            if room is not None:
                room -= sum(rate for at, rate in taken if at >= end)  # younger than every job of [lo, end)
                least = room if least is None else min(least, room)
        lo = end + 1
    return least


class ExactBudget:
    """Rule 12 charged per job inside one admission tick: which candidates it allows, and what the tick did.

    Example (rooms 50, 900, 400 at positions 0, 1, 2; ``R`` as in :func:`least_room`'s example):
        >>> class R:
        ...     rooms = {0: 50, 1: 900, 2: 400}
        ...     def position(self, jid): return int(jid)
        ...     def least(self, lo, hi):
        ...         v = [r for p, r in self.rooms.items() if lo <= p < hi]
        ...         return min(v) if v else None
        >>> from lane_plugin.policy.candidate import Candidate
        >>> b = ExactBudget(R())
        >>> b.allows(Candidate("2", 60, 0.0)), b.allows(Candidate("2", 50, 0.0)), b.allows(Candidate("0", 10**9, 0.0))
        (False, True, True)
        >>> b.admitted(Candidate("0", 500, 0.0)); b.allows(Candidate("2", 60, 0.0))   # 0 went: only 1 is passed
        True
    """

    __slots__ = ("done", "held", "overtook", "rooms", "taken")

    def __init__(self, rooms: Rooms, exempt: Iterable[str] = ()) -> None:
        self.rooms = rooms
        self.done: list[int] = []  # positions of the jobs admitted or left this tick, ascending
        self.taken: list[tuple[int, int]] = []  # (position, rate) of the jobs admitted this tick
        self.overtook = 0  # the rate tokens this tick admits ahead of an older waiting job
        # Jobs that left this tick without being admitted (parked, or held: see :meth:`exempt_charges`), each with
        # its position and how many admissions came before: the ones after it passed it uncounted.
        self.held: dict[str, tuple[int, int]] = {}
        for job_id in exempt:
            p = rooms.position(job_id)
            if p is not None:
                insort(self.done, p)
                self.held[job_id] = (p, 0)

    def _position(self, job_id: str) -> int:
        p = self.rooms.position(job_id)
        return (1 << 62) if p is None else p  # unknown: as if it arrived last (it passes every waiting job)

    def allows(self, c: Candidate) -> bool:
        """Whether every waiting job older than ``c`` keeps room for ``c``'s rate tokens."""
        room = least_room(self.rooms, self._position(c.id), self.done, self.taken)
        return room is None or c.rate <= room

    def admitted(self, c: Candidate) -> None:
        """``c`` is admitted: it passed every older job still waiting."""
        p = self._position(c.id)
        if least_room(self.rooms, p, self.done, self.taken) is not None:
            self.overtook += c.rate
        self.taken.append((p, c.rate))
        insort(self.done, p)

    def uncounted(self, c: Candidate) -> None:
        """``c`` is admitted uncounted (a stage of a run under way): it stops waiting, and charges nobody."""
        insort(self.done, self._position(c.id))

    def left(self, c: Candidate) -> None:
        """``c`` stops waiting without being admitted (parked, or held by its tenant): its room no longer binds."""
        p = self._position(c.id)
        insort(self.done, p)
        if c.id not in self.held:
            self.held[c.id] = (p, len(self.taken))

    def exempt_charges(self) -> list[tuple[str, int]]:
        """``(job id, rate tokens)`` for each job whose room stopped binding this tick without it being admitted,
        and the rate tokens of the younger jobs admitted after that: what the store must not count against it.

        A job held by its tenant's budget, or waiting for the period to reset, or one this tick cannot lease (a
        job nobody waits for, in a gate's tick) still waits: it is passed while it cannot go itself, and those
        passes are not the order's (rule 12 counts a job's passes while it could be admitted). A parked job has
        left the queue: the store ignores its entry.

        Example (``R`` as above):
            >>> class R:
            ...     def position(self, jid): return int(jid)
            ...     def least(self, lo, hi): return None
            >>> from lane_plugin.policy.candidate import Candidate
            >>> b = ExactBudget(R(), exempt=["0"])
            >>> b.admitted(Candidate("3", 40, 0.0)); b.left(Candidate("1", 10, 0.0)); b.admitted(Candidate("5", 7, 0.0))
            >>> b.exempt_charges()
            [('0', 47), ('1', 7)]
        """
        out = []
        for job_id, (p, since) in self.held.items():
            charged = sum(rate for at, rate in self.taken[since:] if at > p)
            if charged:
                out.append((job_id, charged))
        return out

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

**With tenants** a job is charged only for the younger jobs *of its own tenant* that pass it: ``O_K`` counts
those, the rooms are kept per tenant (positions stay the lane's arrival order). Rule 12 then bounds the reordering
the order does within a tenant (the size classes), and leaves the order between tenants to the fair merge (rule 11,
:mod:`lane_plugin.policy.fairness`) and its service-gap bound, which a lane-wide count overrode (measured: a gap
of 3.98M rate tokens at weights 3:1 on the Azure code trace, against 15.4k with the rule off; docs/admission.md).
With one tenant (a lane without tenants) nothing changes. With several, rule 12's proof reads within the tenant:
the rate tokens of K's tenant admitted between K's arrival and its admission are at most ``V_K^t + key_K``
(``V_K^t`` those of its tenant waiting when it arrived, all older; ``key_K`` as above, from the lane's ``V`` and
``Q``, so no smaller than a key from its tenant's): within ``key_K`` of its tenant's own first come, first served.

tests/policy/test_perjob.py checks the bound for every job on random traffic with tenants (hypothesis).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .candidate import Candidate


class Rooms(Protocol):
    """The waiting jobs' rooms (``key - O``) by arrival position, as the store held them at the tick's start.

    Positions are the lane's arrival order (unique across tenants); rooms are kept per tenant: a job is charged only
    for the younger jobs *of its own tenant* that pass it (the module's "With tenants").
    """

    def position(self, job_id: str) -> int | None:
        """The arrival position of waiting job ``job_id`` (None: not waiting)."""

    def tenant(self, job_id: str) -> str:
        """The tenant whose rooms waiting job ``job_id`` is counted in (the candidate's own, as the store holds it)."""

    def least(self, lo: int, hi: int, tenant: str) -> int | None:
        """The least room of ``tenant``'s waiting jobs with ``lo <= position < hi`` (None: none waits there)."""


def least_room(
    rooms: Rooms, tenant: str, position: int, done: Sequence[int], taken: Sequence[tuple[int, int, str]]
) -> int | None:
    """The least room left, after this tick's admissions, among ``tenant``'s jobs still waiting older than ``position``.

    ``done``: the positions of the jobs admitted or left this tick, ascending; ``taken``: ``(position, rate, tenant)``
    of those admitted. A job K of ``tenant`` older than ``position`` and not done has had every job of ``taken`` of
    its tenant younger than it pass it this tick (``O_K`` grew by their rates); the jobs of ``done`` cut the older
    range into pieces with the same younger admissions each. None: no job of ``tenant`` older than ``position``
    waits (the candidate passes nobody its rule counts).

    Example:
        >>> class R:
        ...     rooms = {0: 50, 1: 900, 2: 400}
        ...     def position(self, jid): return int(jid)
        ...     def tenant(self, jid): return "t"
        ...     def least(self, lo, hi, tenant):
        ...         v = [r for p, r in self.rooms.items() if lo <= p < hi and tenant == "t"]
        ...         return min(v) if v else None
        >>> least_room(R(), "t", 3, (), ()), least_room(R(), "t", 3, (0,), ((0, 100, "t"),))
        (50, 400)
        >>> least_room(R(), "t", 3, (2,), ((2, 30, "t"),))   # 2 went: 0 and 1 were passed by its 30 this tick
        20
        >>> least_room(R(), "u", 3, (), ()), least_room(R(), "t", 3, (2,), ((2, 30, "u"),))   # another tenant's
        (None, 50)
    """
    least: int | None = None
    lo = 0
    for end in [*done[: bisect_left(done, position)], position]:
        if lo < end:
            room = rooms.least(lo, end, tenant)
            if room is not None:
                room -= sum(rate for at, rate, t in taken if at >= end and t == tenant)  # younger, of its tenant
                least = room if least is None else min(least, room)
        lo = end + 1
    return least


class ExactBudget:
    """Rule 12 charged per job inside one admission tick: which candidates it allows, and what the tick did.

    Example (rooms 50, 900, 400 at positions 0, 1, 2, all of tenant ``t``; ``R`` as in :func:`least_room`'s example):
        >>> class R:
        ...     rooms = {0: 50, 1: 900, 2: 400}
        ...     def position(self, jid): return int(jid)
        ...     def tenant(self, jid): return "u" if jid == "5" else "t"
        ...     def least(self, lo, hi, tenant):
        ...         v = [r for p, r in self.rooms.items() if lo <= p < hi and tenant == "t"]
        ...         return min(v) if v else None
        >>> from lane_plugin.policy.candidate import Candidate
        >>> b = ExactBudget(R())
        >>> b.allows(Candidate("2", 60, 0.0, tenant="t")), b.allows(Candidate("2", 50, 0.0, tenant="t"))
        (False, True)
        >>> b.allows(Candidate("0", 10**9, 0.0, tenant="t")), b.allows(Candidate("5", 10**9, 0.0, tenant="u"))
        (True, True)
        >>> b.admitted(Candidate("0", 500, 0.0, tenant="t")); b.allows(Candidate("2", 60, 0.0, tenant="t"))
        True
    """

    __slots__ = ("done", "held", "overtook", "rooms", "taken")

    def __init__(self, rooms: Rooms, exempt: Iterable[str] = ()) -> None:
        self.rooms = rooms
        self.done: list[int] = []  # positions of the jobs admitted or left this tick, ascending
        self.taken: list[tuple[int, int, str]] = []  # (position, rate, tenant) of the jobs admitted this tick
        self.overtook = 0  # the rate tokens this tick admits ahead of an older waiting job of their tenant
        # Jobs that left this tick without being admitted (parked, or held: see :meth:`exempt_charges`), each with
        # its position, tenant and how many admissions came before: the ones after it passed it uncounted.
        self.held: dict[str, tuple[int, str, int]] = {}
        for job_id in exempt:
            p = rooms.position(job_id)
            if p is not None:
                insort(self.done, p)
                self.held[job_id] = (p, rooms.tenant(job_id), 0)

    def _position(self, job_id: str) -> int:
        p = self.rooms.position(job_id)
        return (1 << 62) if p is None else p  # unknown: as if it arrived last (it passes every waiting job)

    def allows(self, c: Candidate) -> bool:
        """Whether every waiting job of ``c``'s tenant older than ``c`` keeps room for ``c``'s rate tokens."""
        room = least_room(self.rooms, self.rooms.tenant(c.id), self._position(c.id), self.done, self.taken)
        return room is None or c.rate <= room

    def admitted(self, c: Candidate) -> None:
        """``c`` is admitted: it passed every older job of its tenant still waiting."""
        p, tenant = self._position(c.id), self.rooms.tenant(c.id)
        if least_room(self.rooms, tenant, p, self.done, self.taken) is not None:
            self.overtook += c.rate
        self.taken.append((p, c.rate, tenant))
        insort(self.done, p)

    def uncounted(self, c: Candidate) -> None:
        """``c`` is admitted uncounted (a stage of a run under way): it stops waiting, and charges nobody."""
        insort(self.done, self._position(c.id))

    def left(self, c: Candidate) -> None:
        """``c`` stops waiting without being admitted (parked, or held by its tenant): its room no longer binds."""
        p = self._position(c.id)
        insort(self.done, p)
        if c.id not in self.held:
            self.held[c.id] = (p, self.rooms.tenant(c.id), len(self.taken))

    def exempt_charges(self) -> list[tuple[str, int]]:
        """``(job id, rate tokens)`` for each job whose room stopped binding this tick without it being admitted,
        and the rate tokens of the younger jobs of its tenant admitted after that: what the store must not count
        against it.

        A job held by its tenant's budget, or waiting for the period to reset, or one this tick cannot lease (a
        job nobody waits for, in a gate's tick) still waits: it is passed while it cannot go itself, and those
        passes are not the order's (rule 12 counts a job's passes while it could be admitted). A parked job has
        left the queue: the store ignores its entry.

        Example (``R`` as above):
            >>> class R:
            ...     def position(self, jid): return int(jid)
            ...     def tenant(self, jid): return "u" if jid == "6" else "t"
            ...     def least(self, lo, hi, tenant): return None
            >>> from lane_plugin.policy.candidate import Candidate
            >>> b = ExactBudget(R(), exempt=["0"])
            >>> b.admitted(Candidate("3", 40, 0.0, tenant="t")); b.left(Candidate("1", 10, 0.0, tenant="t"))
            >>> b.admitted(Candidate("5", 7, 0.0, tenant="t")); b.admitted(Candidate("6", 9, 0.0, tenant="u"))
            >>> b.exempt_charges()
            [('0', 47), ('1', 7)]
        """
        out = []
        for job_id, (p, tenant, since) in self.held.items():
            charged = sum(rate for at, rate, t in self.taken[since:] if at > p and t == tenant)
            if charged:
                out.append((job_id, charged))
        return out

"""A pool's promises as one account: a pure function from what is on a filesystem to what
it can still promise.

Everything made on one filesystem shares it, whatever the pool or class: thin images promise
their size and take blocks as their tenants write; thick images take all their blocks up
front; ``reserved`` bytes are never promised nor allocated. The account is per *filesystem*
(two pools on one filesystem are counted together, under the strictest of their settings),
and checking it and recording a new promise are one step (:mod:`localpv.csi.ledger`): two
claims at once can never both take the last room.

The rule, and why:

* **The bound.** Every promise counts at its size toward ``overcommit x capacity -
  reserved``, thin or thick. With ``overcommit: 1`` the pool never promises more than it
  holds, so no tenant can ever hit ENOSPC below its size. Above 1, the operator accepts that
  thin tenants share room they may not all get: the over-committed part, promised beyond
  ``capacity - reserved``, is unbacked *by design*.
* **A thick image must be allocatable now, without taking what thin tenants were promised.**
  Its size, ``reserved``, the part of the thin images' unwritten promises that is meant to be
  backed (all of it with ``overcommit: 1``; less the over-committed part above 1), and what
  other thick images will still allocate (one being made right now, holes a discard left) must
  fit in the free space. Without this a thick image would take the very blocks thin tenants were
  promised, and they would hit ENOSPC far below their size.
* **A thin image must leave ``reserved`` free**: it takes no blocks now, but a pool already at
  or below its reserve accepts no more promises.

Expanding an image replaces its promise by the larger one; a thick image needs only the bytes
it does not hold yet (computed from its real allocation, never from the record).

:func:`open_account` is what callers use; every field is plain data, so the rule is tested on
data (``tests/csi/test_account.py``, property-based).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Terms:
    """The settings the account follows: the strictest of the pools on the filesystem."""

    overcommit: float = 1.0
    reserved: int = 0


@dataclass(frozen=True)
class Space:
    """The filesystem's figures, in bytes: its size and what is free for the agent to allocate."""

    capacity: int
    free: int


@dataclass(frozen=True)
class Promise:
    """One image on the filesystem: its size (promised), whether it is thick, and the bytes it
    really takes now."""

    size: int
    thick: bool = False
    allocated: int = 0

    @property
    def unwritten(self) -> int:
        """What a thin image may still write (a thick one has its blocks)."""
        return 0 if self.thick else max(0, self.size - self.allocated)

    @property
    def unallocated(self) -> int:
        """What a thick image does not hold yet but will (being made, or holes a discard made)."""
        return max(0, self.size - self.allocated) if self.thick else 0


@dataclass(frozen=True)
class Account:
    """What a filesystem has promised and can still promise."""

    terms: Terms
    space: Space
    promised: int
    unwritten: int
    #: What thick images will still allocate (being made, or holes to fill again).
    pending: int = 0
    #: What the images really take now.
    allocated: int = 0

    @property
    def bound(self) -> int:
        """The most that may ever be promised: ``overcommit x capacity - reserved``."""
        return int(self.terms.overcommit * self.space.capacity) - self.terms.reserved

    @property
    def overcommitted(self) -> int:
        """Promises beyond ``capacity - reserved``: unbacked by the operator's choice."""
        return max(0, self.promised - (self.space.capacity - self.terms.reserved))

    @property
    def backing(self) -> int:
        """The part of the thin images' unwritten promises that must stay free for them."""
        return max(0, self.unwritten - self.overcommitted)

    @property
    def unbacked(self) -> int:
        """What thin images may still write beyond the free space less ``reserved`` (0: every
        promise can still be written)."""
        return max(0, self.unwritten - max(0, self.space.free - self.terms.reserved))

    def without(self, promise: Promise) -> Account:
        """The account as if ``promise`` were not there (an image being replaced or grown)."""
        return Account(self.terms, self.space, self.promised - promise.size, self.unwritten - promise.unwritten,
                       self.pending - promise.unallocated, self.allocated - promise.allocated)

    def largest(self, *, thick: bool) -> int:
        """The largest new image accepted now (what a CSIStorageCapacity object says)."""
        promisable = max(0, self.bound - self.promised)
        if thick:
            return max(0, min(promisable, self.space.free - self.terms.reserved - self.backing - self.pending))
        return promisable if self.space.free > self.terms.reserved else 0

    def refusal(self, size: int, *, thick: bool, pool: str, holds: Promise | None = None) -> str | None:
        """Why an image of ``size`` bytes cannot be promised now (None when it can).

        ``holds``: the promise the image already has (an expansion, or a record being made
        again), replaced by this one; a thick image then needs only the bytes it does not hold.
        """
        rest = self.without(holds) if holds is not None else self
        kind = "thick" if thick else "thin"
        if rest.promised + size > rest.bound:
            terms = (f"overcommit {self.terms.overcommit:g} x {_gib(self.space.capacity)} less "
                     f"{_gib(self.terms.reserved)} reserved")
            return (f"pool {pool} has {_gib(rest.promised)} promised of the {_gib(rest.bound)} it may promise "
                    f"({terms}); a {kind} image of {_gib(size)} does not fit")
        reserved = self.terms.reserved
        if thick:
            needed = size - (holds.allocated if holds is not None and holds.thick else 0)
            kept = rest.backing + rest.pending
            if needed + reserved + kept > self.space.free:
                return (f"pool {pool} has {_gib(self.space.free)} free; a thick image of {_gib(size)} needs "
                        f"{_gib(needed)} of it, with {_gib(reserved)} reserved and {_gib(kept)} kept for what "
                        "other images were promised: it does not fit")
            return None
        if self.space.free <= reserved:
            return f"pool {pool} has {_gib(self.space.free)} free, at or below its {_gib(reserved)} reserved"
        return None


def open_account(space: Space, terms: Terms, promises: Iterable[Promise]) -> Account:
    """The account of a filesystem with these promises on it."""
    promised = unwritten = pending = allocated = 0
    for promise in promises:
        promised += promise.size
        unwritten += promise.unwritten
        pending += promise.unallocated
        allocated += promise.allocated
    return Account(terms, space, promised, unwritten, pending, allocated)


def strictest(terms: Iterable[Terms]) -> Terms:
    """The terms of pools sharing a filesystem: the smallest over-commit, the largest reserve."""
    found = list(terms)
    if not found:
        return Terms()
    return Terms(min(t.overcommit for t in found), max(t.reserved for t in found))


def _gib(n: int) -> str:
    if abs(n) >= 1 << 30:
        return f"{n / (1 << 30):.2f} GiB"
    return f"{n / (1 << 20):.0f} MiB"

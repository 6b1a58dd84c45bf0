"""The pools' accounts as they stand (:mod:`localpv.csi.account` decides; this reads what it
decides on), and the one lock per filesystem that makes "is there room?" and "record the
promise" a single step.

Without that step, claims provisioned in parallel (the controller's workers, a StatefulSet's
burst of claims) and expansions each read the same free figures and each record their
promise: together they went past the over-commit bound and into ``reserved``. Holding a
filesystem's lock from the look at its account to the journal write closes that window; the
slow work (``fallocate``, ``mkfs``) happens after, outside the lock, its room already held by
its record.

Pools are grouped by the filesystem their directory is on (its device number, as opened): two
pools on one filesystem are one account, under the strictest of their terms.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from localpv.csi.account import Account, Promise, Space, Terms, open_account, strictest
from localpv.csi.images import ImageError, Usage
from localpv.csi.journal import ImageJournal, ImageRecord
from localpv.csi.pools import Pool, PoolState

_READABLE = (PoolState.READY, PoolState.VOLATILE)


class Ledger:
    """Accounts of this node's pools' filesystems."""

    def __init__(self, journal: ImageJournal, pools: Callable[[], Mapping[str, Pool]]) -> None:
        self.journal = journal
        self.pools = pools
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    def _device(self, pool: Pool) -> int:
        return os.stat(pool.config.mount_dir).st_dev

    def siblings(self, pool: Pool) -> dict[str, Pool]:
        """The pools on ``pool``'s filesystem (itself included), as configured now."""
        device = self._device(pool)
        found = {pool.name: pool}
        for name, other in self.pools().items():
            if name != pool.name and other.state()[0] in _READABLE:
                try:
                    if self._device(other) == device:
                        found[name] = other
                except OSError:
                    continue
        return found

    def account(self, pool: Pool) -> Account:
        """The account of ``pool``'s filesystem now. Raises OSError when it cannot be read."""
        pools = self.siblings(pool)
        st = os.statvfs(pool.config.mount_dir)
        space = Space(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)
        terms = strictest(Terms(p.config.overcommit, p.config.reserved) for p in pools.values())
        records = [r for r in self.journal.snapshot().values() if r.pool in pools]
        usages: dict[str, Usage] = {}
        for name, each in pools.items():
            try:
                usages.update(each.images.usages(r.volume for r in records if r.pool == name))
            except ImageError:
                continue  # that pool's directory cannot be opened now: its images take nothing known
        promises = [Promise(r.size, r.provisioning == "thick", usages[r.volume].allocated if r.volume in usages else 0)
                    for r in records]
        return open_account(space, terms, promises)

    @staticmethod
    def promise(record: ImageRecord, pool: Pool) -> Promise:
        """What one recorded image promises and takes (nothing taken yet if it is not made)."""
        try:
            allocated = pool.images.usage(record.volume).allocated
        except ImageError:
            allocated = 0
        return Promise(record.size, record.provisioning == "thick", allocated)

    @contextmanager
    def step(self, pool: Pool) -> Iterator[Account]:
        """The account of ``pool``'s filesystem, with its lock held until the block ends: record
        the promise (a journal write) inside the block, or the room is not held."""
        device = self._device(pool)
        with self._guard:
            lock = self._locks.setdefault(device, threading.Lock())
        with lock:
            yield self.account(pool)

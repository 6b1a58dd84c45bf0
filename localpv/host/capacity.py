"""Capacity of a mounted filesystem, as the agent reports it on Filesystem PVs."""

from __future__ import annotations

import os

__all__ = ["filesystem_capacity"]


def filesystem_capacity(path: str | int) -> int:
    """Total size in bytes of the filesystem holding ``path`` (or the open descriptor
    ``path``, even an ``O_PATH`` one): ``f_blocks * f_frsize``.

    This is the *total* size, including blocks reserved for root and not the free space,
    because upstream reports that (a 1 GiB ext4 shows up as ~975 MiB) and a replacement
    must produce the same PV capacity for the same disk. Raises ``OSError`` from statvfs.
    """
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize

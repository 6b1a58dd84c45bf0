"""One agent per state dir: a kernel lock on ``<state dir>/agent.lock`` for the process's life.

The state dir holds the cleanup journal and, with dynamic classes, the image journal
(``csi-images.json``): each is read once at start and then rewritten whole by its one writer.
Two agents on one state dir (a DaemonSet rolling with ``maxSurge``, a second DaemonSet by
mistake, a hand-started agent) would each write from their own copy and undo the other's
records - a volume recorded as used by one, rewritten as clean by the other, would be offered
with a tenant's data. So ``localpv agent`` takes an exclusive ``flock`` on the lock file before
it reads either journal, and keeps it until it exits: the kernel drops it when the process
dies, however it dies, so a killed agent never leaves a stale lock behind. The descriptor is
close-on-exec: the cleaner processes the agent starts do not inherit it (a cleaner outliving a
killed agent must not keep the next agent out).

The file's content only says who holds it (pid, host name: the pod's name in a pod), for the
message a second agent exits with; the lock is the ``flock``, not the file. Readers of the
journal (``localpv status`` asks the agent over HTTP; nothing else reads it) need no lock:
writes are atomic renames.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
from dataclasses import dataclass

LOCK_FILE = "agent.lock"


class StateDirInUse(Exception):
    """Another process holds the state dir's lock; the message says who, as far as known."""


@dataclass(frozen=True)
class StateDirLock:
    """The held lock: keep it for the process's life (its descriptor is the lock)."""

    path: str
    fd: int

    def release(self) -> None:
        os.close(self.fd)


def lock_state_dir(state_dir: str) -> StateDirLock:
    """Take the state dir's lock, or raise :class:`StateDirInUse` at once (never wait: a second
    agent must say so and exit, not queue behind the first). OSError when the file cannot be
    made at all (the caller has checked the directory is writable)."""
    path = os.path.join(state_dir, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _holder(fd)
        os.close(fd)
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise
        raise StateDirInUse(f"expected a state dir no other agent uses, found it locked by another agent "
                            f"({holder}; lock file {path}): two agents on one journal would each undo the other's "
                            "records. Stop the other agent (one agent pod per node), or give this one another "
                            "--state-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return StateDirLock(path, fd)


def _holder(fd: int) -> str:
    """What the lock file says of its holder ("holder unknown" while it has not said yet)."""
    try:
        said = os.pread(fd, 256, 0).decode("utf-8", "replace").strip()
    except OSError:
        said = ""
    return said.splitlines()[0] if said else "holder unknown"

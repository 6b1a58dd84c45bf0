"""Fixtures for tests that need a private mount namespace. The mount and loop-device
fixtures (``mounter``, ``tmpfs``, ``loops``...) live in tests/conftest.py, shared with the
agent's end-to-end tests."""

from __future__ import annotations

import ctypes
import os
import pickle
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from tests.support.hostfs import LoopDevice, LoopDevices, MiB, Mounter, sh

__all__ = ["ForkedNamespace", "LoopDevice", "LoopDevices", "MiB", "Mounter", "sh"]

_CLONE_NEWNS = 0x00020000


class ForkedNamespace:
    """A forked child that runs ``fn`` in a mount namespace of its own.

    Tests that must not see other people's mounts (another test run on the same machine
    mounting things wakes a mount-table watcher) run there. ``propagation`` is applied to
    ``/`` recursively after unsharing: "private" isolates completely, "slave" still
    receives mounts made in the parent under shared mounts, like a pod's
    ``HostToContainer`` volume. Mounts made in the child vanish with it.
    """

    def __init__(self, fn: Callable[[], Any], propagation: str = "private") -> None:
        self._read, write = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # child: never return into pytest
            os.close(self._read)
            try:
                _unshare_mount_namespace(propagation)
                outcome: tuple[str, Any] = ("ok", fn())
            except BaseException:
                outcome = ("error", traceback.format_exc())
            with os.fdopen(write, "wb") as f:
                pickle.dump(outcome, f)
            os._exit(0)
        os.close(write)

    def result(self) -> Any:
        """Wait for the child; return what ``fn`` returned or fail with its traceback."""
        with os.fdopen(self._read, "rb") as f:
            data = f.read()
        os.waitpid(self._pid, 0)
        status, value = pickle.loads(data) if data else ("error", "child died without a result")
        if status != "ok":
            pytest.fail(f"in the child mount namespace:\n{value}")
        return value


def _unshare_mount_namespace(propagation: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    sh("mount", f"--make-r{propagation}", "/")


@pytest.fixture
def in_private_mount_namespace() -> Callable[[Callable[[], Any]], Any]:
    """Run a function in a forked child with a private mount namespace; return its result."""
    return lambda fn: ForkedNamespace(fn).result()

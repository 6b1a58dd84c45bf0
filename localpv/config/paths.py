"""Path safety of discovery directories: normalised spellings, and the root and system trees
(``/dev``, ``/proc``, ``/etc``...) refused whatever the spelling."""

from __future__ import annotations

import posixpath
from typing import Any

from localpv.config.values import _as_str, _Problems
from localpv.naming import (
    CONTROL_CHARS,
    quote_text,
)

#: Trees of the kernel, the OS and the node's container machinery. Neither they nor any
#: directory inside them is a discovery directory: every mount point in one becomes a volume
#: that a tenant gets and that is wiped on release, and here those are /boot/efi, the kubelet's
#: secret tmpfs mounts, a runtime's image layers, /proc's binfmt_misc...
SYSTEM_TREES = (
    "/proc", "/sys", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot",
    "/run", "/var/run", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker",
    "/var/lib/containers", "/var/lib/etcd",
)


#: Directories whose own entries belong to the system (/dev/shm, /var/log, /home/<user>), though
#: a dedicated directory inside them is fine (/dev/disk/by-id, /var/lib/localpv-disks).
SYSTEM_DIRS = ("/dev", "/home", "/root", "/var", "/var/lib")


def normalise_dir(path: str) -> str:
    """An absolute path in one spelling: no ``.``, no empty or trailing components.

    ``posixpath.normpath`` alone keeps a leading ``//`` (POSIX leaves its meaning to the
    system), which would let ``//`` pass as "not /".
    """
    return "/" + posixpath.normpath(path).lstrip("/")


def within(path: str, tree: str) -> bool:
    """Whether the normalised ``path`` is ``tree`` or inside it, by whole components
    (``/mnt/fast2`` is not inside ``/mnt/fast``)."""
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def system_directory_refusal(path: str) -> str | None:
    """What is expected instead, when the normalised absolute ``path`` is the root or a system
    directory (see :data:`SYSTEM_TREES`, :data:`SYSTEM_DIRS`); None when it may be discovered.

    Whole components are compared, never string prefixes: ``/var/lib/kubelet-disks`` is fine.
    """
    if path == "/":
        return 'a dedicated discovery directory, not "/"'
    for tree in SYSTEM_TREES:
        if within(path, tree):
            return f"a directory outside {tree} (a system directory)"
    if path in SYSTEM_DIRS:
        return f"a dedicated directory inside {path}, not {path} itself (its entries belong to the system)"
    return None


def _spelling_refusal(text: str) -> str | None:
    """What is expected instead, when a directory is spelled unusably whatever it names."""
    if CONTROL_CHARS.search(text):
        return "a path without control characters"
    if not text.startswith("/"):
        return "an absolute path"
    if ".." in text.split("/"):
        # Folding ".." by hand can disagree with the node, where a symlink before it leads elsewhere.
        return 'a path without ".." components'
    return None


def _parse_abs_path(value: Any, path: str, problems: _Problems) -> str | None:
    """A discovery directory (hostDir, mountDir), checked in its normalised form and stored so.

    Checking the text as written let ``/.`` and ``/tmp/..`` through as "not /" (issue 11):
    the agent then offered /proc, /sys and /dev as volumes and wiped /srv on release.
    """
    text = _as_str(value, path, problems)
    if text is None:
        return None
    if expected := _spelling_refusal(text):
        problems.error(path, f"expected {expected}, got {quote_text(text)}")
        return None
    normal = normalise_dir(text)
    if expected := system_directory_refusal(normal):
        alias = "" if normal == text else f" (which is {quote_text(normal)})"
        problems.error(path, f"expected {expected}, got {quote_text(text)}{alias}")
        return None
    return normal

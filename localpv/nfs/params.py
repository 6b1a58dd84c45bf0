"""StorageClass parameters of the NFS mode, read exactly as nfs-subdir reads them.

Kept apart from the directory code so the compatibility rules (research A.3) are in one
small place: ``onDelete`` wins when it is exactly ``delete`` or ``retain``; otherwise
``archiveOnDelete`` decides, parsed with Go's ``strconv.ParseBool``, and an *absent* value
means archive (the chart's default, and the safe one: no data is lost).

``allowSharedDirectories`` and ``allowOtherClusters`` are ours: absent means false, so a
class must say in so many words that its claims may be handed a directory another claim, or
another cluster's claim, made.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

PATH_PATTERN = "pathPattern"
ON_DELETE = "onDelete"
ARCHIVE_ON_DELETE = "archiveOnDelete"
#: Ours, not upstream's: claims of different identities may share a directory (see ownership).
ALLOW_SHARED_DIRECTORIES = "allowSharedDirectories"
#: Ours: claims may be handed a directory another cluster on the same export recorded.
ALLOW_OTHER_CLUSTERS = "allowOtherClusters"

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``: the same spellings, and an error for anything else."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"invalid boolean {text!r} (use true/false, t/f, 1/0)")


class OnDelete(enum.Enum):
    """What happens to a released volume's directory."""

    DELETE = "delete"
    RETAIN = "retain"
    ARCHIVE = "archive"


def on_delete(parameters: Mapping[str, Any]) -> OnDelete:
    """The directory's fate from the class parameters; ValueError for an unparsable ``archiveOnDelete``."""
    explicit = parameters.get(ON_DELETE)
    if explicit == "delete":
        return OnDelete.DELETE
    if explicit == "retain":
        return OnDelete.RETAIN
    archive = parameters.get(ARCHIVE_ON_DELETE)
    if archive is None:
        return OnDelete.ARCHIVE
    try:
        return OnDelete.ARCHIVE if parse_bool(str(archive)) else OnDelete.DELETE
    except ValueError as err:
        raise ValueError(f"parameters.{ARCHIVE_ON_DELETE}: {err}") from err


def path_pattern(parameters: Mapping[str, Any]) -> str | None:
    value = parameters.get(PATH_PATTERN)
    return str(value) if value else None


def allow_shared_directories(parameters: Mapping[str, Any]) -> bool:
    """Whether the class opts in to sharing directories between claims; ValueError if unparsable."""
    return _opt_in(parameters, ALLOW_SHARED_DIRECTORIES)


def allow_other_clusters(parameters: Mapping[str, Any]) -> bool:
    """Whether the class opts in to using directories recorded by other clusters (or before
    records named a cluster); ValueError if unparsable."""
    return _opt_in(parameters, ALLOW_OTHER_CLUSTERS)


def _opt_in(parameters: Mapping[str, Any], key: str) -> bool:
    """An opt-in parameter: absent is false. A typo must not silently mean "yes": anything but a
    ParseBool spelling is an error."""
    value = parameters.get(key)
    if value is None:
        return False
    try:
        return parse_bool(str(value))
    except ValueError as err:
        raise ValueError(f"parameters.{key}: {err}") from err

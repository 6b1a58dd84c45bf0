"""Trying a dynamic class's mkfsOptions for real before any claim meets them (``localpv config check``).

The configuration's own rules (:mod:`localpv.config.mkfs`) refuse what is known to make a bad
volume; what they do not know (a value out of range, a feature this mkfs lacks, a log too big
for a small volume) only mkfs can say. So each class's options are given to mkfs, with the
very command line and read-back a create uses (:func:`localpv.csi.images.make_filesystem`),
on a sparse scratch image of the smallest size a claim of that filesystem can get, in a
temporary directory. No root is needed: the image is a regular file.

Where the tool is not installed (a check run off the node, on a workstation without
xfsprogs), that is said in one line instead of failing the check.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from localpv.config.dynamic import DynamicClass
from localpv.csi.images import MIN_SIZE, FsType, ImageError, make_filesystem
from localpv.naming import quote_text


@dataclass(frozen=True)
class TrialLines:
    """What the trial found, as configuration problems: one line each, with the key path."""

    errors: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def try_mkfs(fs: FsType, *, thick: bool, options: str) -> str | None:
    """None when mkfs, given ``options``, makes ``fs`` on a scratch image of the smallest size;
    otherwise what happened (one line)."""
    with tempfile.TemporaryDirectory(prefix="localpv-mkfs-trial-") as scratch:
        fd = os.open(os.path.join(scratch, "disk.img"), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, MIN_SIZE[fs])
            make_filesystem(fd, fs, str(uuid.uuid4()), thick=thick, options=options)
        except ImageError as err:
            return str(err)
        finally:
            os.close(fd)
    return None


def try_classes(classes: Mapping[str, DynamicClass]) -> TrialLines:
    """Try the mkfsOptions of every class that has some (the defaults are localpv's own)."""
    errors: list[str] = []
    warnings: list[str] = []
    for name, cls in classes.items():
        if not cls.mkfs_options.strip():
            continue
        fs = FsType(cls.fs_type)
        where = f"dynamicClassMap.{name}.mkfsOptions"
        tool = f"mkfs.{fs.value}"
        if shutil.which(tool) is None:
            warnings.append(f"{where}: {tool} is not installed here, so the options were checked by their spelling "
                            "only, not tried")
            continue
        if (problem := try_mkfs(fs, thick=cls.provisioning == "thick", options=cls.mkfs_options)) is not None:
            errors.append(f"{where}: expected options with which {tool} makes a filesystem (tried on a scratch image "
                          f"of {MIN_SIZE[fs] >> 20} MiB, the smallest claim of {fs.value}), got "
                          f"{quote_text(cls.mkfs_options)}: {problem}")
    return TrialLines(tuple(errors), tuple(warnings))

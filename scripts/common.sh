#!/usr/bin/env bash
# Helpers for the volume cleaner scripts; source it, do not run it.
#
# The provisioner runs a cleaner with the volume named in the environment, as a path inside
# the container: LOCAL_PV_BLKDEVICE for a block volume, LOCAL_PV_FILESYSTEM for a filesystem
# volume (cleanup Jobs). A cleaner exits 0 only when the volume is clean: the volume is
# offered to the next claim right after that.

# Messages go to stderr; the provisioner logs both streams line by line.
log() {
  printf '%s: %s\n' "${0##*/}" "$*" >&2
}

die() {
  printf '%s: error: %s\n' "${0##*/}" "$*" >&2
  exit 1
}

# Check LOCAL_PV_BLKDEVICE names a block device (a symlink to one is fine).
require_block_device() {
  [[ -n "${LOCAL_PV_BLKDEVICE:-}" ]] || die "LOCAL_PV_BLKDEVICE is not set"
  [[ -b "$LOCAL_PV_BLKDEVICE" ]] || die "LOCAL_PV_BLKDEVICE=$LOCAL_PV_BLKDEVICE is not a block device"
  require_unused_device
}

# Refuse a device the kernel holds: mounted, holding a mounted partition, swap, or under
# device-mapper/md. An exclusive open (O_EXCL on a block device) fails with EBUSY exactly
# then, so a cleanup Job can never wipe a disk the node is using.
require_unused_device() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 - "$LOCAL_PV_BLKDEVICE" <<'PY' || die "LOCAL_PV_BLKDEVICE=$LOCAL_PV_BLKDEVICE is in use (mounted, a mounted partition, swap or device-mapper); not wiping it"
import os
import sys

try:
    os.close(os.open(sys.argv[1], os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC))
except OSError as err:
    sys.exit(f"{sys.argv[1]}: {err.strerror}")
PY
}

# Check LOCAL_PV_FILESYSTEM names a directory.
require_filesystem() {
  [[ -n "${LOCAL_PV_FILESYSTEM:-}" ]] || die "LOCAL_PV_FILESYSTEM is not set"
  [[ -d "$LOCAL_PV_FILESYSTEM" ]] || die "LOCAL_PV_FILESYSTEM=$LOCAL_PV_FILESYSTEM is not a directory"
}

# require_count NAME VALUE: VALUE must be a non-negative decimal integer.
require_count() {
  [[ "$2" =~ ^[0-9]+$ ]] || die "$1 must be a non-negative integer, got '$2'"
}

# idle_io COMMAND...: run COMMAND in the idle I/O class when this system allows it, so that
# wiping a disk does not starve the workloads still running on the node.
idle_io() {
  if command -v ionice >/dev/null 2>&1 && ionice -c 3 true 2>/dev/null; then
    ionice -c 3 "$@"
  else
    "$@"
  fi
}

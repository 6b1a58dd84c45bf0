#!/usr/bin/env bash
# Overwrite a block volume with zeros ITERATIONS times (default 1).
# Usage: dd_zero.sh [ITERATIONS]
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"

iterations=${1:-1}
require_count "ITERATIONS" "$iterations"
require_block_device
dev=$LOCAL_PV_BLKDEVICE

for ((pass = 1; pass <= iterations; pass++)); do
  log "zeroing $dev, pass $pass of $iterations"
  # dd writes until the device is full, and stops there with "No space left on device":
  # that message, and only it, means the whole device was written. Direct I/O keeps
  # gigabytes of zeros out of the node's page cache.
  if output=$(LC_ALL=C idle_io dd if=/dev/zero of="$dev" bs=1M oflag=direct 2>&1); then
    die "dd stopped before the end of $dev: $output"
  fi
  printf '%s\n' "$output" >&2
  [[ "$output" == *"No space left on device"* ]] || die "dd failed on $dev"
done
sync "$dev"
log "zeroing of $dev done"

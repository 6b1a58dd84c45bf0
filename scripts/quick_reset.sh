#!/usr/bin/env bash
# Quick reset of a block volume (the default cleaner): make a filesystem on the whole device,
# which also discards (TRIMs) it where the device supports that, then wipe every filesystem
# signature so the next user sees a blank device. Data blocks are not overwritten on devices
# without discard: use shred.sh or dd_zero.sh when that matters.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"

require_block_device
dev=$LOCAL_PV_BLKDEVICE

log "making a throwaway filesystem on $dev"
idle_io mkfs -t ext4 -F "$dev"
log "wiping signatures from $dev"
idle_io wipefs --all "$dev"
log "quick reset of $dev done"

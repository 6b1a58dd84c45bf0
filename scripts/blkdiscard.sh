#!/usr/bin/env bash
# Discard (TRIM) every sector of a block volume. Fast on SSDs; after a discard most devices
# read back zeros, but that depends on the device. Fails if the device cannot discard.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"

require_block_device
dev=$LOCAL_PV_BLKDEVICE

log "discarding all of $dev"
idle_io blkdiscard -v "$dev"
log "discard of $dev done"

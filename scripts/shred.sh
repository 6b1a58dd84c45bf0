#!/usr/bin/env bash
# Overwrite a block volume with random data ITERATIONS times (default 3), then with zeros.
# Usage: shred.sh [ITERATIONS]
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"

iterations=${1:-3}
require_count "ITERATIONS" "$iterations"
require_block_device
dev=$LOCAL_PV_BLKDEVICE

log "shredding $dev: $iterations random pass(es) and a final zero pass"
idle_io shred -v -z -f -n "$iterations" "$dev"
log "shred of $dev done"

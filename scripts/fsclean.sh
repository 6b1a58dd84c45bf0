#!/usr/bin/env bash
# Remove everything inside a filesystem volume, keeping the volume directory itself.
# Never follows symlinks (find -P, the default) and never deletes through another mount:
# a filesystem mounted inside the volume fails the clean, since the volume would otherwise
# be offered with someone else's data inside.
set -euo pipefail
# shellcheck source=common.sh source-path=SCRIPTDIR
source "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/common.sh"

require_filesystem
[[ ! -L "$LOCAL_PV_FILESYSTEM" ]] || die "$LOCAL_PV_FILESYSTEM is a symlink; refusing to follow it"
dir=$(readlink -f -- "$LOCAL_PV_FILESYSTEM")
[[ "$dir" != / ]] || die "refusing to clean /"

# findmnt -r prints mount points with special characters as \xHH escapes; printf %b decodes them.
while IFS= read -r target; do
  target=$(printf '%b' "$target")
  if [[ "$target" == "$dir"/* ]]; then
    # The path below the volume is made of the tenant's directory names: not echoed.
    die "a filesystem is mounted inside the volume; unmount it (findmnt -R $dir lists it)"
  fi
done < <(findmnt --raw --noheadings --output TARGET)

log "removing the contents of $dir"
# -xdev also keeps find out of another filesystem mounted after the check above; removing
# its mount point then fails, and so does the clean.
idle_io find "$dir" -mindepth 1 -xdev -delete
if [[ -n "$(find "$dir" -mindepth 1 -maxdepth 1 -print -quit)" ]]; then
  die "$dir is not empty after cleaning"
fi
log "clean of $dir done"

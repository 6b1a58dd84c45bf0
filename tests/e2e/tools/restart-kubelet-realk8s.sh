#!/usr/bin/env bash
# Restart the kubelet of a realk8s node the hard way (SIGKILL, then the same command line),
# as a node's kubelet dies and comes back under running pods. For tests/e2e: .ci/e2e gives
# it as LOCALPV_E2E_KUBELET_RESTART. Usage: restart-kubelet-realk8s.sh DATA_DIR NODE_NAME
#
# realk8s keeps each node's process ids in DATA/nodes/NAME/pids ("kubelet PID" lines; its
# node-down.sh stops what is listed there, so the new PID replaces the old one) and the
# kernel sysctls the kubelet changes at start in DATA/nodes/NAME/sysctls.orig ("key value"
# lines, key as under /proc/sys); they are put back as soon as the new kubelet changes them
# (kernel.panic_on_oops=1 would turn any oops into a reboot of this machine).
set -euo pipefail
data=$1 name=$2
node=$data/nodes/$name
old=$(awk '$1=="kubelet"{print $2}' "$node/pids")
if [ -z "$old" ] || [ ! -r "/proc/$old/cmdline" ]; then
  echo "no running kubelet for node $name in $node/pids" >&2; exit 1
fi
mapfile -d '' argv < "/proc/$old/cmdline"
kill -9 "$old"
for _ in $(seq 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
kill -0 "$old" 2>/dev/null && { echo "kubelet $old did not die" >&2; exit 1; }

pidfile=$node/.pid.kubelet.restarted
rm -f "$pidfile"
# shellcheck disable=SC2016 # expanded by the inner shell
setsid bash -c 'echo $$ > "$0"; exec "$@"' "$pidfile" "${argv[@]}" >> "$data/logs/kubelet-$name.log" 2>&1 < /dev/null &
for _ in $(seq 100); do [ -s "$pidfile" ] && break; sleep 0.05; done
new=$(cat "$pidfile")
sed -i "s/^kubelet .*/kubelet $new/" "$node/pids"

restore() {
  local key value changed=1
  while read -r key value; do
    if [ "$(cat "/proc/sys/$key")" != "$value" ]; then echo "$value" > "/proc/sys/$key"; changed=0; fi
  done < "$node/sysctls.orig"
  return $changed
}
# The kubelet sets them once, a few seconds after its start.
for _ in $(seq 300); do
  restore && { sleep 0.3; restore || true; break; }
  kill -0 "$new" 2>/dev/null || { echo "the restarted kubelet exited" >&2; exit 1; }
  sleep 0.1
done
echo "kubelet of $name restarted: pid $new (was $old)"

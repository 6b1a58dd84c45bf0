#!/usr/bin/env bash
# Start a realk8s node (its node-up.sh) whose kubelet and containerd see a /var/log/pods of
# their own. Kubernetes 1.20 hardcodes that directory, and every kubelet's container GC removes,
# about once a minute, each pod log directory there whose pod it does not run: two kubelets on
# one host remove each other's pods' logs (`kubectl logs` then answers "failed to try resolving
# symlinks ... no such file or directory"). So the node's processes start in a mount namespace
# of their own where /var/log/pods is a bind mount of DATA/pod-logs/NAME; every other mount is
# shared as it is (--propagation unchanged), so what the kubelet and containerd mount under the
# node's dir (rshared) is seen by the host and by the agents as before, and realk8s's
# node-down.sh, run from the host, stops the node as before (the namespace goes with its last
# process). Mounts the host makes after the node started reach it only below a mount that was
# shared before (the host's root is private here): .ci/e2e makes the suite's work dir one.
# For .ci/e2e (the second node). Usage: node-up-own-pod-logs.sh REALK8S DATA_DIR NAME
set -euo pipefail
realk8s=$1 data=$2 name=$3
logs=$data/pod-logs/$name
mkdir -p "$logs" /var/log/pods
# shellcheck disable=SC2016 # expanded by the inner shell
exec unshare --mount --propagation unchanged \
  bash -c 'mount --bind "$0" /var/log/pods && exec bash "$1/node-up.sh" "$2" "$3"' "$logs" "$realk8s" "$data" "$name"

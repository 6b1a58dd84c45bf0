"""An agent's cost of other nodes' claims (issue 25.2), as root:

    python -m benchmarks.claims --other-claims 10000 [--agent-tree OTHER_CHECKOUT]

A real ``localpv agent`` process with a dynamic class (its CSI node plugin and provisioning
controller running; the pool's directory exists, no disk is mounted on it: no claim of this
node is provisioned, none is asked for), against the API emulator holding the Node and the
class. Twice: with no other claims, and with N claims of 500 other nodes already scheduled and
labelled (as the claim labeller leaves them). Each time:

* RSS once the agent's claim watch is open and it has idled 3 s;
* the bytes of claims the emulator sent it: its first list of claims, then its claim watch (and
  any relist) while N more claims of other nodes are created, scheduled and labelled (a create,
  then the labeller's patch, as in a cluster) - counted by the emulator as each event's line
  goes out (``RequestLog.bytes_sent``).

``--agent-tree`` runs the agent of another checkout (an export of main, for the "before"
figures: it watches every claim); the agent runs as ``python -P`` so that the current directory
is not on its path and the tree named is the one imported. Prints what it measured; asserts
nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from benchmarks.agent import machine
from benchmarks.programs import Program, Running
from localpv_emulator.apiserver import ApiServer
from localpv_emulator.objects import claim, node, storage_class

NODE = "bench-node"
DRIVER = "local.csi.localpv.dev"
KEY = "localpv.dev/node"
SELECTED = "volume.kubernetes.io/selected-node"


def other_claim(i: int, *, labelled: bool) -> dict[str, object]:
    made = claim(f"other-{i}", "dyn", size="10Gi", namespace=f"ns-{i % 50}", selected_node=f"node-{i % 500}")
    if labelled:
        made["metadata"]["labels"] = {KEY: f"node-{i % 500}"}
    return made


def settled(read: Callable[[], int], quiet: float = 2.0, timeout: float = 300.0) -> int:
    """``read()`` once it has not changed for ``quiet`` seconds (the last events delivered)."""
    deadline = time.monotonic() + timeout
    last, since = read(), time.monotonic()
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        threading.Event().wait(0.2)
        now = read()
        if now != last:
            last, since = now, time.monotonic()
    return last


def measure(existing: int, added: int, tree: str | None) -> tuple[int, int, int]:
    """(idle RSS with ``existing`` other claims, bytes of its first claim list, bytes of its claim
    watch while ``added`` more arrive)."""
    server = ApiServer(binder=False)
    server.start()
    work = Path(tempfile.mkdtemp(prefix="bench-claims-"))
    short = Path(tempfile.mkdtemp(prefix="bc-", dir="/tmp"))
    try:
        server.create(node(NODE))
        server.create(storage_class("dyn", provisioner=DRIVER, parameters={"pool": "p"}))
        for i in range(50):
            server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": f"ns-{i}"}})
        for i in range(existing):
            server.create(other_claim(i, labelled=True))
        (work / "pool").mkdir()
        (work / "d").mkdir()
        cfg = work / "config.yaml"
        cfg.write_text(yaml.safe_dump({
            "storageClassMap": {"local-fs": {"hostDir": "/mnt/disks", "mountDir": str(work / "d")}},
            "dynamicPools": {"p": {"hostDir": str(work / "pool")}}, "dynamicClassMap": {"dyn": {"pool": "p"}}}))
        kubeconfig = server.write_kubeconfig(work / "kubeconfig")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "PYTHONPATH": tree or str(Path(__file__).resolve().parent.parent)}
        argv = [sys.executable, "-P", "-m", "localpv", "agent", "--config", str(cfg), "--node", NODE, "--kubeconfig",
                str(kubeconfig), "--listen-address", "127.0.0.1:0", "--state-dir", str(work / "state"),
                "--kubelet-dir", str(short / "k")]
        program = Program("localpv agent", argv, env)
        with Running(program, work / "log") as proc:
            proc.wait_for(lambda: server.requests.count(verb="watch", resource="persistentvolumeclaims") > 0, 120,
                          "its claim watch")
            threading.Event().wait(3)
            rss = proc.rss()
            listed = server.requests.bytes_sent("list", "persistentvolumeclaims")
            watched = server.requests.bytes_sent(resource="persistentvolumeclaims")
            for i in range(existing, existing + added):
                made = server.create(other_claim(i, labelled=False))
                made["metadata"]["labels"] = {KEY: f"node-{i % 500}"}  # the labeller's patch
                server.update(made)
            watched = settled(lambda: server.requests.bytes_sent(resource="persistentvolumeclaims")) - watched
            proc.check_alive()
        return rss, listed, watched
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--other-claims", type=int, default=10000)
    parser.add_argument("--agent-tree", default=None, help="run the agent of this checkout (PYTHONPATH)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (the agent's CSI plugin)")
    print(machine())
    which = f"`localpv agent` of {args.agent_tree}" if args.agent_tree else "`localpv agent`"
    print(f"{which} with a dynamic class, among claims of 500 other nodes:")
    for existing in (0, args.other_claims):
        rss, listed, watched = measure(existing, args.other_claims, args.agent_tree)
        print(f"  {existing:>6} other claims in the cluster: RSS {rss / 2**20:.1f} MiB, its claim list "
              f"{listed / 2**10:.1f} KiB; {args.other_claims} more created and labelled: its claim watch (and relists) "
              f"{watched / 2**10:.1f} KiB")


if __name__ == "__main__":
    main()

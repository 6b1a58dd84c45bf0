"""Data safety on real mounts against the emulator: identities, not names (issue 11, 1-3).

Each scenario is one an operator or a GitOps tool really produces: a PV deleted and
applied again, a class's ``hostDir`` changed to another spelling of the same directory,
a node whose state dir was lost. Throughout each one a watcher checks the promise that
matters - no PV for the volume is Available while the volume holds the previous
tenant's files - not only at the end.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.journal import Journal
from localpv_emulator.objects import claim
from tests.agent.conftest import AgentEnv
from tests.conftest import wait_for
from tests.support.hostfs import LoopDevices, Mounter

pytestmark = pytest.mark.root

Obj = dict[str, Any]


@contextmanager
def never_offered_dirty(env: AgentEnv, host_path: str, dirty: Callable[[], bool]) -> Iterator[list[str]]:
    """Poll, in the background, that no PV for ``host_path`` is Available while ``dirty()``."""
    violations: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pv = env.pv_for(host_path)
            if pv is not None and pv.get("status", {}).get("phase") == "Available" and dirty():
                violations.append(f"PV {pv['metadata']['name']} uid {pv['metadata']['uid']} Available while dirty")
                return
            stop.wait(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield violations
    finally:
        stop.set()
        thread.join(5)
    assert violations == [], violations


def use(env: AgentEnv, host_path: str, sc: str, write: Callable[[], None], mode: str = "Filesystem") -> Obj:
    """Claim the volume, write as the tenant, wait until the journal knows it was used."""
    pv = wait_for(lambda: env.phase(host_path) == "Available" and env.pv_for(host_path), timeout=10,
                  what=f"{host_path} Available")
    env.apiserver.create(claim("c1", sc, mode=mode))
    wait_for(lambda: env.phase(host_path) == "Bound", timeout=10, what=f"{host_path} Bound")
    write()
    wait_for(lambda: (e := Journal(env.state_dir / "journal.json").get(host_path)) is not None and e.state == "used",
             timeout=10, what="journal records the use")
    return dict(pv)


def reapply(env: AgentEnv, pv: Obj) -> Obj:
    """What `kubectl apply` of a saved manifest does after the PV was deleted: same name,
    labels and spec, a new object (new uid), no claim."""
    fresh = {"apiVersion": "v1", "kind": "PersistentVolume",
             "metadata": {k: v for k, v in pv["metadata"].items() if k in ("name", "labels", "annotations")},
             "spec": {k: v for k, v in pv["spec"].items() if k != "claimRef"}}
    return env.apiserver.create(fresh)


def delete_claim_and_pv(env: AgentEnv, pv: Obj) -> None:
    env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(lambda: env.phase(pv["spec"]["local"]["path"]) == "Released", timeout=10, what="Released")
    env.apiserver.delete("v1", "PersistentVolume", pv["metadata"]["name"])


def offered_again(env: AgentEnv, host_path: str, not_uids: set[str]) -> Obj | None:
    pv = env.pv_for(host_path)
    if pv and pv["metadata"]["uid"] not in not_uids and pv.get("status", {}).get("phase") == "Available":
        return pv
    return None


def events(env: AgentEnv, reason: str) -> list[Obj]:
    return [e for e in env.apiserver.list("v1", "Event", "default") if e.get("reason") == reason]


# --------------------------------------------------------------------------- finding 1


def test_pv_reapplied_while_the_agent_was_down_is_not_offered_dirty(agent_env: AgentEnv, mounter: Mounter) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    host_path = "/mnt/disks/vol1"
    agent_env.start_agent()
    old = use(agent_env, host_path, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    agent_env.stop_agents()
    delete_claim_and_pv(agent_env, old)
    again = reapply(agent_env, old)
    # The re-applied PV is on offer while no agent runs; the agent's first pass must end that.
    agent = agent_env.start_agent()
    wait_for(lambda: agent.passes >= 1, timeout=10, what="first pass")
    with never_offered_dirty(agent_env, host_path, lambda: bool(os.listdir(vol))):
        new = wait_for(lambda: offered_again(agent_env, host_path, {old["metadata"]["uid"], again["metadata"]["uid"]}),
                       timeout=15, what="a fresh PV after the clean")
    assert os.listdir(vol) == []
    assert new["metadata"]["name"] == old["metadata"]["name"]
    # Events are written by the recorder's own thread: wait for the write, do not race it.
    wait_for(lambda: events(agent_env, "VolumeRetracted"), timeout=10, what="a VolumeRetracted event")


def test_pv_reapplied_while_its_volume_is_being_cleaned_is_not_offered_dirty(
    agent_env: AgentEnv, loops: LoopDevices, tmp_path: Path
) -> None:
    dev = loops.attach(size=4 * 1024 * 1024)
    (agent_env.block_dir / "disk1").symlink_to(dev.path)
    gate, started = tmp_path / "gate", tmp_path / "started"
    script = tmp_path / "slow.sh"
    script.write_text(f"#!/bin/sh\ntouch {started}\nwhile [ ! -e {gate} ]; do sleep 0.02; done\n"
                      'dd if=/dev/zero of="$LOCAL_PV_BLKDEVICE" bs=1M oflag=direct 2>/dev/null; exit 0\n')
    script.chmod(0o755)
    config = agent_env.config(storageClassMap={"fast": {
        "hostDir": "/mnt/fast", "mountDir": str(agent_env.block_dir), "volumeMode": "Block",
        "blockCleanerCommand": [str(script)]}})
    host_path = "/mnt/fast/disk1"

    def dirty() -> bool:
        with open(dev.path, "rb") as f:
            return f.read(65536) != b"\0" * 65536

    agent_env.start_agent(config)

    def write() -> None:
        with open(dev.path, "r+b") as f:
            f.write(b"\xee" * 65536)

    old = use(agent_env, host_path, "fast", write, mode="Block")
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
    wait_for(started.exists, timeout=10, what="the cleaner started")
    agent_env.apiserver.delete("v1", "PersistentVolume", old["metadata"]["name"])
    # On offer from the moment it is applied until the agent's next pass (milliseconds:
    # the PV informer triggers it); from then on it must never be on offer again.
    again = reapply(agent_env, old)
    wait_for(lambda: (p := agent_env.pv_for(host_path)) is None or p["metadata"]["uid"] != again["metadata"]["uid"],
             timeout=10, what="the re-applied PV retracted")
    with never_offered_dirty(agent_env, host_path, dirty):
        assert not gate.exists(), "retracted while the old clean still runs"
        gate.touch()
        wait_for(lambda: offered_again(agent_env, host_path, {old["metadata"]["uid"], again["metadata"]["uid"]}),
                 timeout=15, what="offered again after the clean")
    assert not dirty()


# --------------------------------------------------------------------------- finding 2


def test_host_dir_changed_to_an_alias_does_not_offer_a_volume_whose_cleanup_fails(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices, tmp_path: Path
) -> None:
    disk = loops.attach(ext4=True)
    vol = mounter.device(disk.path, agent_env.fs_dir / "vol1")
    agent_env.start_agent()
    stuck = vol / "immutable"

    def write() -> None:
        stuck.write_text("tenant a")
        subprocess.run(["chattr", "+i", str(stuck)], check=True)

    try:
        old = use(agent_env, "/mnt/disks/vol1", "local-fs", write)
        agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "c1", "default")
        wait_for(lambda: events(agent_env, "VolumeFailedDelete"), timeout=15, what="the cleanup fails")
        agent_env.stop_agents()
        # The operator "fixes" it: the class now names the same directory another way,
        # and the stuck PV is deleted by hand.
        alias = tmp_path / "alias"
        alias.symlink_to(agent_env.fs_dir)
        config = agent_env.config(storageClassMap={"local-fs": {"hostDir": "/mnt/alias", "mountDir": str(alias)}})
        agent_env.apiserver.delete("v1", "PersistentVolume", old["metadata"]["name"])
        with never_offered_dirty(agent_env, "/mnt/alias/vol1", stuck.exists):
            agent_env.start_agent(config)
            wait_for(lambda: (e := Journal(agent_env.state_dir / "journal.json").get("/mnt/alias/vol1")) is not None
                     and e.state == "cleaning", timeout=10, what="the record followed the volume to its new path")
            # The record is moved before the event is written (by the recorder's own thread).
            wait_for(lambda: events(agent_env, "VolumeMoved"), timeout=10, what="a VolumeMoved event")
            wait_for(lambda: any("/mnt/alias/vol1" in e.get("message", "") for e in events(agent_env,
                                                                                            "VolumeFailedDelete")),
                     timeout=15, what="the cleanup goes on, and fails, under the new path")
            assert agent_env.pv_for("/mnt/alias/vol1") is None
            subprocess.run(["chattr", "-i", str(stuck)], check=True)
            wait_for(lambda: offered_again(agent_env, "/mnt/alias/vol1", set()), timeout=15,
                     what="offered once clean")
        assert os.listdir(vol) == []
    finally:
        if stuck.exists():
            subprocess.run(["chattr", "-i", str(stuck)], check=False)


# --------------------------------------------------------------------------- finding 3


def test_lost_state_dir_cleans_before_offering_and_says_so(agent_env: AgentEnv, mounter: Mounter) -> None:
    vol = mounter.tmpfs(agent_env.fs_dir / "vol1")
    host_path = "/mnt/disks/vol1"
    agent_env.start_agent()
    old = use(agent_env, host_path, "local-fs", lambda: (vol / "secret").write_text("tenant a"))
    agent_env.stop_agents()
    delete_claim_and_pv(agent_env, old)
    for name in os.listdir(agent_env.state_dir):  # the node was re-imaged
        path = agent_env.state_dir / name
        if path.is_file():
            path.unlink()
    agent = agent_env.start_agent()
    with never_offered_dirty(agent_env, host_path, lambda: bool(os.listdir(vol))):
        wait_for(lambda: offered_again(agent_env, host_path, {old["metadata"]["uid"]}), timeout=15,
                 what="offered after the clean")
    assert os.listdir(vol) == []
    [event] = events(agent_env, "JournalRecovering")
    assert event["involvedObject"]["kind"] == "Node" and "state dir" in event["message"]
    assert not agent.journal.recovering, "one complete pass ends the recovery"

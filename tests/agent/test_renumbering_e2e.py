"""Disks renumbered, swapped and replaced across an agent restart, on real ext4 and xfs (issue 17).

Each test builds what a node really goes through: ext4 (or xfs) images on loop devices mounted
*by device name* (as an fstab line ``/dev/sdb /mnt/disks/a`` does), tenants writing through
bound claims, the agent stopped ("the node goes down"), and the images attached again on other
loop device numbers ("the kernel enumerates the disks in another order at boot") or a new
image put where an old one was ("a failed disk replaced"). The promise checked throughout: no
live tenant's data is ever deleted, and nothing that may hold data is offered.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from localpv.agent.journal import Journal
from localpv.host.identity import IdentityReader
from localpv.host.mounts import mount_points
from localpv.host.scan import Entry, scan_directory
from localpv.naming import parse_quantity
from tests.agent.conftest import AgentEnv
from tests.conftest import NEEDS_XFS, wait_for
from tests.support.agentenv import bound_claim, events, forget_identities
from tests.support.hostfs import LoopDevice, LoopDevices, Mounter, sh

pytestmark = pytest.mark.root

Obj = dict[str, Any]
MiB = 1024 * 1024


def uuid(dev: LoopDevice) -> str:
    return sh("blkid", "-p", "-o", "value", "-s", "UUID", dev.path).strip()


def reboot(loops: LoopDevices, mounter: Mounter, mounts: dict[Path, LoopDevice],
           images: dict[Path, LoopDevice]) -> dict[Path, LoopDevice]:
    """Unmount and detach every disk, then attach ``images[target]``'s image on the device
    number ``mounts[target]`` had, and mount each target from its device *name* again."""
    numbers = {target: dev.path for target, dev in mounts.items()}
    for target in mounts:
        mounter.umount(target)
    for dev in {d.path: d for d in [*mounts.values(), *images.values()]}.values():
        loops.detach(dev)
    attached = {target: loops.attach_image(images[target].backing, numbers[target]) for target in mounts}
    for target, dev in attached.items():
        mounter.device(dev.path, target)
    return attached


@pytest.mark.parametrize("fs", ["ext4", pytest.param("xfs", marks=NEEDS_XFS)])
def test_disks_swapped_at_boot_never_wipe_the_other_tenant_and_say_so(
    fs: str, agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    size = 300 * MiB if fs == "xfs" else 16 * MiB
    disk_a, disk_b = loops.attach(size=size, fs=fs), loops.attach(size=size, fs=fs)
    path_a, path_b = agent_env.fs_dir / "a", agent_env.fs_dir / "b"
    mounter.device(disk_a.path, path_a)
    mounter.device(disk_b.path, path_b)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    pv_b = bound_claim(agent_env, "tenant-b", "/mnt/disks/b")
    (path_a / "a-data").write_text("tenant a")
    (path_b / "b-data").write_text("tenant b")
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    # The node reboots and the kernel enumerates the two disks the other way round.
    reboot(loops, mounter, {path_a: disk_a, path_b: disk_b}, {path_a: disk_b, path_b: disk_a})
    assert (path_a / "b-data").exists(), "tenant b's disk is now at a's path"
    agent = agent_env.start_agent()
    node_events = wait_for(lambda: [e for e in events(agent_env, "VolumeIdentityMismatch")
                                    if e["involvedObject"]["kind"] == "Node"], timeout=15,
                           what="a mismatch event on the Node")
    assert all(uuid(disk_a) in e["message"] and uuid(disk_b) in e["message"] for e in node_events)
    for _ in range(3):  # a few more passes, in case one of them would act
        agent.reconcile_once()
    assert (path_a / "b-data").read_text() == "tenant b", "tenant b's live disk was wiped"
    assert (path_b / "a-data").exists(), "not cleaned anywhere while the disks are swapped"
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"], "PV a kept"
    on = {(e["involvedObject"]["kind"], e["involvedObject"]["name"]) for e in events(agent_env,
                                                                                       "VolumeIdentityMismatch")}
    assert ("PersistentVolume", pv_a["metadata"]["name"]) in on
    assert ("PersistentVolumeClaim", "tenant-b") in on, "the live tenant's claim says it too"
    status = agent.status()
    held = [v for v in status["volumes"] if v["held"]]
    assert {v["path"] for v in held} >= {"/mnt/disks/a", "/mnt/disks/b"}
    assert agent.metrics.registry.get_sample_value("localpv_volume_identity_mismatches", {"class": "local-fs"}) == 2
    # The operator mounts each disk at its own path again (by UUID): the cleanup goes on.
    for target in (path_a, path_b):
        mounter.umount(target)
    mounter.device(loops_path(loops, disk_a), path_a)
    mounter.device(loops_path(loops, disk_b), path_b)
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="a cleaned and offered again")
    assert os.listdir(path_a) == [] or set(os.listdir(path_a)) <= {"lost+found"}
    assert (path_b / "b-data").read_text() == "tenant b"
    assert agent_env.phase("/mnt/disks/b") == "Bound" and pv_b["metadata"]["name"]


def loops_path(loops: LoopDevices, dev: LoopDevice) -> str:
    """The device an image is attached on now (it moved at the 'reboot')."""
    return next(d.path for d in loops.attached if d.backing == dev.backing)


def test_a_released_disk_found_at_another_path_is_cleaned_there_and_its_old_pv_goes(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    disk = loops.attach(size=16 * MiB, ext4=True)
    path_a, path_c = agent_env.fs_dir / "a", agent_env.fs_dir / "c"
    mounter.device(disk.path, path_a)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    (path_a / "a-data").write_text("tenant a")
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    mounter.umount(path_a)  # at boot the disk is mounted elsewhere (a new fstab line, a label mount)
    mounter.device(disk.path, path_c)
    agent_env.start_agent()
    wait_for(lambda: agent_env.pv_for("/mnt/disks/a") is None, timeout=15, what="the old PV deleted")
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/c")) is not None and pv["status"]["phase"] == "Available",
             timeout=20, what="the volume offered at its new path once clean")
    assert not (path_c / "a-data").exists()
    wait_for(lambda: events(agent_env, "VolumeMoved"), timeout=10, what="VolumeMoved on the Node")
    assert pv_a["metadata"]["name"] != agent_env.pv_for("/mnt/disks/c")["metadata"]["name"]


def test_a_replaced_disk_is_not_wiped_by_the_old_record_which_waits_for_the_old_disk(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    old = loops.attach(size=16 * MiB, ext4=True)
    path_a = agent_env.fs_dir / "a"
    mounter.device(old.path, path_a)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    (path_a / "a-data").write_text("tenant a")
    agent_env.stop_agents()
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    # The failed disk is pulled; a new one comes up under the same device name and is mounted there.
    number, old_uuid = old.path, uuid(old)
    mounter.umount(path_a)
    loops.detach(old)
    fresh = loops.attach(size=16 * MiB)
    loops.detach(fresh)
    new = loops.attach_image(fresh.backing, number)
    sh("mkfs.ext4", "-q", "-F", new.path)
    mounter.device(new.path, path_a)
    (path_a / "brought-along").write_text("the new disk's own data")
    agent_env.start_agent()
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/a")) is not None
             and pv["metadata"]["uid"] != pv_a["metadata"]["uid"] and pv["status"]["phase"] == "Available",
             timeout=20, what="the new disk offered as a new volume")
    assert (path_a / "brought-along").exists(), "the new disk was wiped by the old disk's record"
    wait_for(lambda: events(agent_env, "VolumeReplaced"), timeout=10, what="VolumeReplaced on the Node")
    journal = Journal(agent_env.state_dir / "journal.json").snapshot()
    [kept] = [e for k, e in journal.items() if not k.startswith("/")]
    assert kept.state == "cleaning" and kept.identity == f"fs:uuid={old_uuid}"
    # The old disk comes back, elsewhere: its record follows it and it is cleaned before any offer.
    back = loops.attach_image(old.backing)
    path_d = agent_env.fs_dir / "d"
    mounter.device(back.path, path_d)
    wait_for(lambda: (pv := agent_env.pv_for("/mnt/disks/d")) is not None and pv["status"]["phase"] == "Available",
             timeout=20, what="the old disk offered once clean")
    assert not (path_d / "a-data").exists()


def test_identity_in_the_journal_is_what_the_reader_says(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    disk = loops.attach(size=16 * MiB, ext4=True)
    mounter.device(disk.path, agent_env.fs_dir / "a")
    agent_env.start_agent()
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Available", timeout=10, what="offered")
    record = Journal(agent_env.state_dir / "journal.json").get("/mnt/disks/a")
    assert record is not None and record.identity == f"fs:uuid={uuid(disk)}"
    assert IdentityReader().block(os.stat(disk.path).st_rdev).value.startswith("blk:loop=")


def run_job_container(job: Obj) -> subprocess.CompletedProcess[str]:
    """Do what the Job's pod would do on this node: its command, with its environment."""
    container = job["spec"]["template"]["spec"]["containers"][0]
    env = {**os.environ, **{e["name"]: e["value"] for e in container.get("env", [])}}
    return subprocess.run(container["command"], env=env, capture_output=True, text=True, timeout=60, check=False)


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_a_cleanup_job_that_starts_after_the_disks_were_swapped_refuses_the_other_disk(
    mode: str, agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    """The decision is made, the Job created; its pod starts after a reboot renumbered the disks."""
    disk_a, disk_b = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=16 * MiB, ext4=True)
    if mode == "Filesystem":
        base, host_base, sc = agent_env.fs_dir, "/mnt/disks", "local-fs"
        mounter.device(disk_a.path, base / "a")
        mounter.device(disk_b.path, base / "b")
    else:
        base, host_base, sc = agent_env.block_dir, "/mnt/fast", "fast"
        (base / "a").symlink_to(disk_a.path)  # a link to the device *name*, as by-path links of old
        (base / "b").symlink_to(disk_b.path)
    config = agent_env.config(useJobForCleaning=True, useJobForFilesystemCleaning=True)
    agent_env.start_agent(config, job_image="localpv:test")
    wait_for(lambda: agent_env.phase(f"{host_base}/a") == "Available", timeout=10, what="a offered")
    pv_a = agent_env.pv_for(f"{host_base}/a")
    assert pv_a is not None
    agent_env.apiserver.create({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "tenant-a", "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": sc, "volumeMode": mode,
                 "volumeName": pv_a["metadata"]["name"], "resources": {"requests": {"storage": "1Mi"}}}})
    wait_for(lambda: agent_env.phase(f"{host_base}/a") == "Bound", timeout=10, what="a Bound")
    marker = b"tenant b's data" * 100
    if mode == "Filesystem":
        (base / "b" / "b-data").write_bytes(marker)
    else:
        with open(disk_b.path, "r+b") as f:
            f.seek(8 * MiB)
            f.write(marker)
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    job = wait_for(lambda: agent_env.apiserver.get("batch/v1", "Job", f"cleanup-{pv_a['metadata']['name']}",
                                                   "default"), timeout=10, what="the cleanup Job")
    agent_env.stop_agents()  # the node goes down before the Job's pod ran
    if mode == "Filesystem":
        reboot(loops, mounter, {base / "a": disk_a, base / "b": disk_b}, {base / "a": disk_b, base / "b": disk_a})
    else:
        numbers = (disk_a.path, disk_b.path)
        loops.detach(disk_a)
        loops.detach(disk_b)
        loops.attach_image(disk_b.backing, numbers[0])
        loops.attach_image(disk_a.backing, numbers[1])
    done = run_job_container(job)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "disks renumbered or swapped" in done.stdout + done.stderr
    if mode == "Filesystem":
        assert (base / "a" / "b-data").read_bytes() == marker, "the Job wiped the other tenant's disk"
    else:
        with open(disk_b.backing, "rb") as f:
            f.seek(8 * MiB)
            assert f.read(len(marker)) == marker, "the Job wiped the other tenant's disk"


def test_a_pv_just_created_counts_before_the_cache_shows_it(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reads its PVs from a watch cache, which can lag behind its own writes (a
    dropped watch, a relist). A PV it created that the cache does not show yet must still
    count as existing: here the disk it was made for moves away and another disk takes its
    path before the cache catches up. Taken for "no PV", the record followed its disk and
    the PV stayed on offer over the other disk for good, named and sized for the first (the
    renumbering campaign found it with a released tenant's disk in that place)."""
    disk_x, disk_y = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=24 * MiB, ext4=True)
    path_a, path_b = agent_env.fs_dir / "a", agent_env.fs_dir / "b"
    agent = agent_env.start_agent(watch_host=False, discovery_period=3600)
    wait_for(lambda: agent.ready, timeout=10, what="the agent ready")
    assert agent.pvs is not None
    frozen = agent.pvs.list()
    # The cache lags from here on: what it holds and what it tells of stay as they are.
    monkeypatch.setattr(agent.pvs, "list", lambda: list(frozen))
    monkeypatch.setattr(agent.pvs, "handlers", [])
    mounter.device(disk_x.path, path_a)
    agent.reconcile_once()
    made = agent_env.pv_for("/mnt/disks/a")
    assert made is not None, "the PV for disk x"
    mounter.umount(path_a)  # disk x moves to b, a new disk y takes a
    mounter.device(disk_x.path, path_b)
    mounter.device(disk_y.path, path_a)
    agent.reconcile_once()
    monkeypatch.undo()  # the cache catches up
    informer = agent.pvs
    wait_for(lambda: (pv := informer.get(made["metadata"]["name"])) is not None
             and pv["metadata"]["resourceVersion"] == agent_env.pv_for("/mnt/disks/a")["metadata"]["resourceVersion"],
             timeout=10, what="the cache showing the PV")
    for _ in range(3):
        agent.reconcile_once()
    left = agent_env.pv_for("/mnt/disks/a")
    assert left is None or left["metadata"]["uid"] != made["metadata"]["uid"], \
        "the PV made for disk x is still on offer at a, over disk y"
    assert agent.journal.get("/mnt/disks/a") is None or agent.journal.get("/mnt/disks/a").identity != \
        f"fs:uuid={uuid(disk_x)}", "x's record must not stay at a"


def test_a_disk_swapped_between_the_look_and_the_create_is_not_published_as_the_old_one(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    """A pass scans, plans, then creates. A disk swapped in between (an operator remounting
    disks one by one) must not be published under the plan made for the disk before it: the
    PV would be named and sized for one disk and offer another."""
    disk_x, disk_y = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=32 * MiB, ext4=True)
    path_a = agent_env.fs_dir / "a"
    seen: dict[str, list[Entry]] = {}
    stale = {"on": False}

    def scanner(mount_dir: str, points: frozenset[str]) -> list[Entry]:
        """The scan as it was when the pass looked, before the swap."""
        if not stale["on"]:
            seen[mount_dir] = scan_directory(mount_dir, points)
        return seen[mount_dir]

    agent = agent_env.start_agent(watch_host=False, discovery_period=3600, scanner=scanner)
    wait_for(lambda: agent.ready, timeout=10, what="the agent ready")
    mounter.device(disk_x.path, path_a)
    scanner(str(agent_env.fs_dir), mount_points())  # the pass looks: disk x at a
    stale["on"] = True
    mounter.umount(path_a)  # ... and disk y takes a before the PV is created
    mounter.device(disk_y.path, path_a)
    agent.reconcile_once()
    pv = agent_env.pv_for("/mnt/disks/a")
    assert pv is None, f"a PV planned for disk x offers disk y: {pv and pv['spec']['capacity']}"
    stale["on"] = False
    agent.reconcile_once()
    pv = wait_for(lambda: agent_env.pv_for("/mnt/disks/a"), timeout=10, what="disk y published")
    assert parse_quantity(pv["spec"]["capacity"]["storage"]) > 16 * MiB, "sized for disk y (disk x is 16 MiB whole)"
    record = agent.journal.get("/mnt/disks/a")
    assert record is not None and record.identity == f"fs:uuid={uuid(disk_y)}"


def test_disks_swapped_before_the_first_pass_after_an_upgrade_learn_their_own_identities(
    agent_env: AgentEnv, mounter: Mounter, loops: LoopDevices
) -> None:
    """A journal from before identities knows each disk by its device numbers only. Two disks
    swapped (``mount --move``: each keeps its numbers) before the new version's first pass: the
    numbers prove it, so each record learns the identity of the disk it recorded, and the path
    that shows the other one is held like any identity mismatch."""
    disk_a, disk_b = loops.attach(size=16 * MiB, ext4=True), loops.attach(size=16 * MiB, ext4=True)
    path_a, path_b = agent_env.fs_dir / "a", agent_env.fs_dir / "b"
    mounter.device(disk_a.path, path_a)
    mounter.device(disk_b.path, path_b)
    agent_env.start_agent()
    pv_a = bound_claim(agent_env, "tenant-a", "/mnt/disks/a")
    bound_claim(agent_env, "tenant-b", "/mnt/disks/b")
    (path_a / "a-data").write_text("tenant a")
    (path_b / "b-data").write_text("tenant b")
    agent_env.stop_agents()
    forget_identities(agent_env.state_dir)
    agent_env.apiserver.delete("v1", "PersistentVolumeClaim", "tenant-a", "default")
    wait_for(lambda: agent_env.phase("/mnt/disks/a") == "Released", timeout=10, what="a Released")
    spare = agent_env.root / "spare"
    spare.mkdir()
    for source, target in ((path_a, spare), (path_b, path_a), (spare, path_b)):
        sh("mount", "--move", source, target)
    agent = agent_env.start_agent()
    wait_for(lambda: [e for e in events(agent_env, "VolumeIdentityMismatch")
                      if e["involvedObject"]["kind"] == "Node"], timeout=15, what="a mismatch event on the Node")
    for _ in range(3):
        agent.reconcile_once()
    records = Journal(agent_env.state_dir / "journal.json").snapshot()
    assert records["/mnt/disks/a"].identity == f"fs:uuid={uuid(disk_a)}", "a learnt the disk it recorded"
    assert records["/mnt/disks/b"].identity == f"fs:uuid={uuid(disk_b)}", "b learnt the disk it recorded"
    assert (path_a / "b-data").read_text() == "tenant b", "the bound tenant's disk was wiped"
    assert (path_b / "a-data").exists(), "not cleaned anywhere while the disks are swapped"
    assert agent_env.pv_for("/mnt/disks/a")["metadata"]["uid"] == pv_a["metadata"]["uid"], "PV a kept"
    assert {v["path"] for v in agent.status()["volumes"] if v["held"]} == {"/mnt/disks/a", "/mnt/disks/b"}

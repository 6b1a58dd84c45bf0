"""The doctor's verdicts on constructed facts (no host, no API)."""

from __future__ import annotations

import pytest

from localpv.config import ClassConfig, ProvisionerConfig, parse_config
from localpv.doctor import (
    ERROR,
    OK,
    WARN,
    Access,
    ClassFacts,
    ClusterFacts,
    HostFacts,
    check_access,
    check_dev,
    check_directory,
    check_node,
    check_propagation,
    check_storage_classes,
    containing_mount,
    diagnose,
    failed,
    propagation,
    render,
    required_access,
)
from localpv.host.mounts import MountInfo, parse_mountinfo
from localpv.host.scan import Entry, EntryKind

FS = ClassConfig(name="local-fs", host_dir="/mnt/disks", mount_dir="/pod/disks")
BLOCK = ClassConfig(name="nvme", host_dir="/mnt/nvme", mount_dir="/mnt/nvme", volume_mode="Block")


def mount(point: str, *tags: str, fs_type: str = "ext4") -> MountInfo:
    return MountInfo(1, 0, "8:1", "/", point, "rw", fs_type, "/dev/sda1", "rw", tuple(tags))


def test_optional_fields_are_parsed_from_mountinfo() -> None:
    text = ("36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw\n"
            "37 35 98:0 / /a rw shared:4 master:2 - ext4 /dev/sda rw\n"
            "38 35 98:0 / /b rw - ext4 /dev/sda rw\n")
    assert [m.optional_fields for m in parse_mountinfo(text)] == [("master:1",), ("shared:4", "master:2"), ()]


@pytest.mark.parametrize(("tags", "mode"), [
    (("master:3",), "slave"), (("shared:1", "master:2"), "slave"), (("shared:7",), "shared"),
    (("unbindable",), "unbindable"), ((), "private"), (("propagate_from:2", "master:5"), "slave"),
])
def test_propagation_mode_from_the_tags(tags: tuple[str, ...], mode: str) -> None:
    assert propagation(mount("/x", *tags)) == mode


def test_containing_mount_is_the_deepest_and_respects_path_components() -> None:
    table = [mount("/"), mount("/pod"), mount("/pod/disk"), mount("/pod/disks", "master:1"),
             mount("/pod/disks", "shared:9")]
    assert containing_mount(table, "/pod/disks").optional_fields == ("shared:9",)  # type: ignore[union-attr]
    assert containing_mount(table, "/pod/disks/a/b").mount_point == "/pod/disks"  # type: ignore[union-attr]
    assert containing_mount(table, "/pod/diskette").mount_point == "/pod"  # type: ignore[union-attr]
    assert containing_mount(table, "/elsewhere").mount_point == "/"  # type: ignore[union-attr]
    assert containing_mount([], "/x") is None


def test_plain_directory_entry_is_an_error_whose_fix_is_a_bind_mount_of_the_host_path() -> None:
    entries = (Entry("vol1", "/pod/disks/vol1", EntryKind.MOUNTPOINT, 1 << 30),
               Entry("vol2", "/pod/disks/vol2", EntryKind.DIRECTORY, reason="not a mount point"))
    findings = check_directory(ClassFacts(FS, None, entries))
    assert findings[0].level == OK and "2 entries, 1 usable" in findings[0].message
    [problem] = [f for f in findings if f.level == ERROR]
    assert "/pod/disks/vol2" in problem.message
    assert "mount --bind /mnt/disks/vol2 /mnt/disks/vol2" in problem.fix


def test_other_entry_kinds_in_the_wrong_class() -> None:
    entries = (Entry("a", "/mnt/nvme/a", EntryKind.MOUNTPOINT), Entry("b", "/mnt/nvme/b", EntryKind.BROKEN,
                                                                       reason='cannot stat "/mnt/nvme/b"'),
               Entry("c", "/mnt/nvme/c", EntryKind.OTHER, reason="neither"), Entry("d", "/mnt/nvme/d", EntryKind.BLOCK))
    findings = check_directory(ClassFacts(BLOCK, None, entries))
    assert "1 usable as Block" in findings[0].message
    errors = [f for f in findings if f.level == ERROR]
    assert len(errors) == 3
    assert "Block class" in errors[0].message and "mountDevVolume" in errors[1].fix and "remove" in errors[2].fix


def test_missing_directory() -> None:
    [finding] = check_directory(ClassFacts(FS, "No such file or directory"))
    assert finding.level == ERROR and "/pod/disks" in finding.message and "/mnt/disks" in finding.fix
    assert check_propagation(ClassFacts(FS, "No such file or directory"), in_pod=True) == []


def test_propagation_verdicts() -> None:
    def verdict(m: MountInfo | None, in_pod: bool = True) -> str:
        [finding] = check_propagation(ClassFacts(FS, None, (), m), in_pod)
        return finding.level

    assert verdict(mount("/pod/disks", "master:4")) == OK
    assert verdict(mount("/pod/disks", "shared:4")) == OK
    assert verdict(mount("/pod/disks")) == ERROR
    assert verdict(mount("/", "master:1", fs_type="overlay")) == ERROR  # not a volume at all
    assert verdict(mount("/pod/disks"), in_pod=False) == OK
    [private] = check_propagation(ClassFacts(FS, None, (), mount("/pod/disks")), True)
    assert "HostToContainer" in private.fix and "private" in private.message


def test_dev_must_be_the_hosts_for_block_classes_in_a_pod() -> None:
    block = ClassFacts(BLOCK, None)
    fs = ClassFacts(FS, None)
    assert check_dev(HostFacts((block,), True, "devtmpfs"))[0].level == OK
    [bad] = check_dev(HostFacts((block, fs), True, "tmpfs"))
    assert bad.level == ERROR and "nvme" in bad.message and "mountDevVolume: true" in bad.fix
    assert check_dev(HostFacts((fs,), True, "tmpfs")) == []
    assert check_dev(HostFacts((block,), False, "tmpfs")) == []


def test_node_checks() -> None:
    assert check_node(ClusterFacts("n1", None, "not found"))[0].level == ERROR
    [unlabelled] = check_node(ClusterFacts("n1", {"metadata": {"name": "n1", "labels": {}}}))
    assert unlabelled.level == ERROR and "kubectl label node n1 kubernetes.io/hostname=n1" in unlabelled.fix
    good = {"metadata": {"name": "n1", "labels": {"kubernetes.io/hostname": "n1"}}}
    assert check_node(ClusterFacts("n1", good))[0].level == OK


def test_storage_class_checks() -> None:
    config = parse_config({"storageClassMap": {
        name: {"hostDir": f"/mnt/{name}", "mountDir": f"/mnt/{name}"} for name in ("a", "b", "c", "d")}}).config
    cluster = ClusterFacts("n1", None, storage_classes={
        "a": {"volumeBindingMode": "WaitForFirstConsumer"}, "b": {"volumeBindingMode": "Immediate"}, "c": None},
        storage_class_errors={"d": "403 Forbidden"})
    levels = {f.subject: f.level for f in check_storage_classes(config, cluster)}
    assert levels == {"class a": OK, "class b": WARN, "class c": ERROR, "class d": ERROR}


def test_required_access_follows_the_configuration() -> None:
    plain = {(a.verb, a.resource) for a in required_access(ProvisionerConfig(), "storage")}
    assert ("create", "persistentvolumes") in plain and ("update", "nodes") not in plain
    assert not any(resource == "jobs" for _, resource in plain)
    jobs = [a for a in required_access(ProvisionerConfig(use_job_for_cleaning=True,
                                                         remove_node_not_ready_taint=True), "storage")
            if a.resource in ("jobs", "nodes")]
    assert {(a.verb, a.namespace) for a in jobs if a.resource == "jobs"} == {
        (v, "storage") for v in ("get", "list", "watch", "create", "delete")}
    assert ("update", None) in {(a.verb, a.namespace) for a in jobs if a.resource == "nodes"}


def test_access_findings_name_each_denied_permission() -> None:
    granted = ClusterFacts("n1", None, access=(Access("get", "nodes", allowed=True),))
    assert check_access(granted)[0].level == OK
    denied = ClusterFacts("n1", None, access=(
        Access("create", "jobs", "batch", "storage", allowed=False, reason="no rule"),
        Access("get", "nodes", allowed=None, reason="not verifiable")))
    messages = [f.message for f in check_access(denied)]
    assert messages == ['cannot create jobs.batch in namespace "storage" (no rule)',
                        "cannot get nodes (not verifiable)"]


def test_diagnose_and_render() -> None:
    config = parse_config({"storageClassMap": {"local-fs": {"hostDir": "/mnt/disks", "mountDir": "/pod/disks"}}}).config
    host = HostFacts((ClassFacts(config.classes["local-fs"], None, (), mount("/pod/disks")),), True, "devtmpfs")
    findings = diagnose(config, host, ClusterFacts("n1", None, unreachable="connection refused"))
    assert failed(findings)
    text = render(findings)
    assert "ERROR  class local-fs: /pod/disks has private propagation" in text
    assert "ERROR  api: the API server cannot be used: connection refused" in text
    assert "       fix: set mountPropagation: HostToContainer" in text
    empty = diagnose(ProvisionerConfig(), HostFacts((), False, None), None)
    assert failed(empty) and "no storage classes" in empty[0].message


# ---------------------------------------------------------------- identities and the running agent


def test_a_volume_whose_identity_cannot_be_read_is_an_error_with_its_fix() -> None:
    from localpv.host.identity import Identity

    bad = Entry("a", "/pod/disks/a", EntryKind.MOUNTPOINT, 1, device=2049,
                identity=Identity("", "", "cannot read the filesystem UUID of device 8:16: Permission denied"))
    findings = check_directory(ClassFacts(FS, None, (bad,)))
    [error] = [f for f in findings if f.level == ERROR]
    assert "identity cannot be read" in error.message and "mountDevVolume" in error.fix


def test_a_disk_without_identity_is_a_warning_and_tmpfs_is_not() -> None:
    from localpv.host.identity import Identity

    disk = Entry("d", "/mnt/nvme/d", EntryKind.BLOCK, 1, device=2049,
                 identity=Identity("", "volatile: the disk reports no WWN or serial (...)"))
    tmpfs = Entry("t", "/pod/disks/t", EntryKind.MOUNTPOINT, 1, device=44,
                  identity=Identity("", "volatile: tmpfs has no device to identify it by"))
    known = Entry("k", "/pod/disks/k", EntryKind.MOUNTPOINT, 1, device=2050,
                  identity=Identity("fs:uuid=1", "filesystem UUID (libblkid)"))
    assert [f.level for f in check_directory(ClassFacts(BLOCK, None, (disk,))) if f.level != OK] == [WARN]
    assert [f for f in check_directory(ClassFacts(FS, None, (tmpfs, known))) if f.level != OK] == []


def test_volumes_the_agent_holds_or_sees_unhealthy_are_errors_and_an_absent_agent_a_warning() -> None:
    from localpv.doctor import AgentFacts, check_agent

    doc = {"volumes": [{"path": "/mnt/disks/a", "held": "volume fs:uuid=1 is now at /mnt/disks/b", "health": []},
                       {"path": "/mnt/disks/b", "pv": "local-pv-1", "held": "", "health": ["ReadOnly"]},
                       {"path": "/mnt/disks/c", "held": "", "health": []}]}
    findings = check_agent(AgentFacts.from_status(doc))
    assert [(f.level, f.subject) for f in findings] == [(ERROR, "identity"), (ERROR, "health")]
    assert "by UUID or WWN" in findings[0].fix and "ReadOnly" in findings[1].message
    assert [f.level for f in check_agent(AgentFacts.from_status({"volumes": []}))] == [OK]
    assert [f.level for f in check_agent(AgentFacts(unavailable="connection refused"))] == [WARN]
    assert check_agent(None) == []

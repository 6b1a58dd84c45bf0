"""PV objects must look exactly like upstream's (research/local-static.md §3.2-3.5), plus our node label."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from localpv.agent.pvbuilder import NodeInfo, StorageClassInfo, VolumeSpec, build_pv, node_affinity, pv_labels
from localpv.config import ClassConfig, ProvisionerConfig, parse_config
from localpv.naming import (
    HOSTNAME_LABEL_KEY,
    NODE_LABEL_KEY,
    PROVISIONED_BY_ANNOTATION,
    GiB,
    MiB,
    node_label_value,
    parse_quantity,
    provisioner_name,
    pv_name,
    round_capacity,
)

NODE = NodeInfo(
    name="test-node",
    uid="node-uid-1",
    labels={HOSTNAME_LABEL_KEY: "test-node-hostname", "topology.kubernetes.io/zone": "zone-a", "rack": "r1"},
)


def make_config(classes: dict[str, dict[str, Any]] | None = None, **top: Any) -> ProvisionerConfig:
    data: dict[str, Any] = {"storageClassMap": classes or {"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}}}
    data.update(top)
    return parse_config(data).config


def make_pv(
    *,
    entry: str = "mount1",
    cls: str = "sc1",
    mode: str = "Filesystem",
    capacity: int = 10 * GiB,
    config: ProvisionerConfig | None = None,
    node: NodeInfo = NODE,
    sc: StorageClassInfo | None = None,
    provisioner: str | None = None,
) -> dict[str, Any]:
    config = config or make_config({cls: {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks"}})
    class_config = config.classes[cls]
    host_path = f"{class_config.host_dir}/{entry}"
    spec = VolumeSpec(pv_name(entry, node.name, cls), host_path, capacity, mode, class_config)
    provisioner = provisioner or provisioner_name(node.name, node.uid, use_node_name_only=config.use_node_name_only)
    return build_pv(spec, node, sc or StorageClassInfo(cls), config, provisioner)


# --------------------------------------------------------------------------- names, paths, spec


@pytest.mark.parametrize(
    ("entry", "cls", "expected"),
    [
        ("mount1", "sc1", "local-pv-aaaafef5"),
        ("symlink2", "sc1", "local-pv-23645a36"),
        ("symlink1", "sc2", "local-pv-55d5adba"),
        ("symlink2", "sc2", "local-pv-226458a3"),
        ("mount1", "sc2", "local-pv-a7aafa3c"),
    ],
)
def test_pv_name_and_path_follow_upstream_vectors(entry: str, cls: str, expected: str) -> None:
    config = make_config({cls: {"hostDir": "/mnt/disks/", "mountDir": "/discovery"}})
    pv = make_pv(entry=entry, cls=cls, config=config)
    assert pv["apiVersion"] == "v1"
    assert pv["kind"] == "PersistentVolume"
    assert pv["metadata"]["name"] == expected
    # The host path, not the container path (mountDir), and no double slash.
    assert pv["spec"]["local"] == {"path": f"/mnt/disks/{entry}"}
    assert pv["spec"]["storageClassName"] == cls


def test_default_filesystem_pv_is_exactly_upstream_shape() -> None:
    pv = make_pv()
    provisioner = "local-volume-provisioner-test-node-node-uid-1"
    assert pv == {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": "local-pv-aaaafef5",
            "labels": {NODE_LABEL_KEY: "test-node"},
            "annotations": {PROVISIONED_BY_ANNOTATION: provisioner},
        },
        "spec": {
            "capacity": {"storage": "10Gi"},
            "local": {"path": "/mnt/disks/mount1"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "sc1",
            "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Delete",
            "nodeAffinity": {
                "required": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": HOSTNAME_LABEL_KEY, "operator": "In", "values": ["test-node-hostname"]},
                        ]},
                    ],
                },
            },
        },
    }
    # Upstream adds no finalizers, no owner references by default, no status.
    assert "finalizers" not in pv["metadata"]
    assert "ownerReferences" not in pv["metadata"]
    assert "status" not in pv


def test_fs_type_is_set_when_configured() -> None:
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks", "fsType": "ext4"}})
    assert make_pv(config=config)["spec"]["local"] == {"path": "/mnt/disks/mount1", "fsType": "ext4"}


def test_fs_type_absent_by_default() -> None:
    assert "fsType" not in make_pv()["spec"]["local"]


@pytest.mark.parametrize("mode", ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"])
def test_access_mode_copied(mode: str) -> None:
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks", "accessMode": mode}})
    assert make_pv(config=config)["spec"]["accessModes"] == [mode]


def test_block_pv_has_block_mode_and_no_mount_options() -> None:
    config = make_config({"sc1": {"hostDir": "/dev/disks", "mountDir": "/dev/disks", "volumeMode": "Block"}})
    sc = StorageClassInfo("sc1", mount_options=("noatime",))
    pv = make_pv(config=config, mode="Block", sc=sc)
    assert pv["spec"]["volumeMode"] == "Block"
    # Upstream ignores SC mount options for Block volumes (with a warning).
    assert "mountOptions" not in pv["spec"]


def test_fs_on_block_pv_is_filesystem_mode_with_mount_options_and_fstype() -> None:
    # A raw device discovered by a Filesystem class: the PV's mode is the configured one.
    config = make_config({"sc1": {"hostDir": "/dev/disks", "mountDir": "/dev/disks", "fsType": "xfs"}})
    sc = StorageClassInfo("sc1", mount_options=("noatime", "discard"))
    pv = make_pv(config=config, mode="Filesystem", sc=sc)
    assert pv["spec"]["volumeMode"] == "Filesystem"
    assert pv["spec"]["mountOptions"] == ["noatime", "discard"]
    assert pv["spec"]["local"]["fsType"] == "xfs"


def test_mount_options_copied_from_storage_class_for_filesystem() -> None:
    sc = StorageClassInfo("sc1", mount_options=("ro", "noexec"))
    assert make_pv(sc=sc)["spec"]["mountOptions"] == ["ro", "noexec"]


def test_no_mount_options_key_when_storage_class_has_none() -> None:
    assert "mountOptions" not in make_pv(sc=StorageClassInfo("sc1"))["spec"]


@pytest.mark.parametrize("policy", ["Delete", "Retain"])
def test_reclaim_policy_from_storage_class(policy: str) -> None:
    pv = make_pv(sc=StorageClassInfo("sc1", reclaim_policy=policy))
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == policy


def test_storage_class_info_from_object_defaults_reclaim_to_delete() -> None:
    sc = StorageClassInfo.from_object({"metadata": {"name": "fast"}, "provisioner": "kubernetes.io/no-provisioner"})
    assert sc == StorageClassInfo("fast", "Delete", ())
    sc = StorageClassInfo.from_object(
        {"metadata": {"name": "fast"}, "reclaimPolicy": "Retain", "mountOptions": ["noatime"]})
    assert sc == StorageClassInfo("fast", "Retain", ("noatime",))


def test_mount_options_are_a_fresh_list() -> None:
    sc = StorageClassInfo("sc1", mount_options=("noatime",))
    pv1 = make_pv(sc=sc)
    pv1["spec"]["mountOptions"].append("mutated")
    assert make_pv(sc=sc)["spec"]["mountOptions"] == ["noatime"]


# --------------------------------------------------------------------------- node affinity


def test_affinity_uses_hostname_label_value_not_node_name() -> None:
    node = NodeInfo("ip-10-0-0-1.ec2.internal", "u", {HOSTNAME_LABEL_KEY: "ip-10-0-0-1"})
    config = make_config()
    terms = node_affinity(node, config.classes["sc1"])["required"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": HOSTNAME_LABEL_KEY, "operator": "In", "values": ["ip-10-0-0-1"]}]}]
    # ... while the PV name hashes the node *name*.
    pv = make_pv(node=node, config=config)
    assert pv["metadata"]["name"] == pv_name("mount1", "ip-10-0-0-1.ec2.internal", "sc1")
    assert pv["metadata"]["name"] != pv_name("mount1", "ip-10-0-0-1", "sc1")


def test_affinity_falls_back_to_node_name_without_hostname_label() -> None:
    node = NodeInfo("n1", "u", {})
    terms = node_affinity(node, make_config().classes["sc1"])["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == ["n1"]


def test_class_selector_terms_are_appended_after_term_zero() -> None:
    selector = [
        {"matchExpressions": [{"key": "shared-disk", "operator": "In", "values": ["group-a"]}]},
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["peer-1", "peer-2"]}]},
    ]
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks", "selector": selector}})
    pv = make_pv(config=config)
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert len(terms) == 3
    assert terms[0] == {"matchExpressions": [
        {"key": HOSTNAME_LABEL_KEY, "operator": "In", "values": ["test-node-hostname"]}]}
    assert terms[1:] == selector


def test_affinity_terms_are_deep_copies_of_the_config() -> None:
    selector = [{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}]}]
    config = make_config({"sc1": {"hostDir": "/mnt/disks", "mountDir": "/mnt/disks", "selector": selector}})
    pv = make_pv(config=config)
    pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][1]["matchExpressions"][0]["values"].append("x")
    assert config.classes["sc1"].selector[0]["matchExpressions"][0]["values"] == ["v"]
    assert make_pv(config=config)["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][1] == selector[0]


# --------------------------------------------------------------------------- labels, annotations, owner


def test_labels_default_to_our_node_label_only() -> None:
    assert pv_labels(NODE, make_config()) == {NODE_LABEL_KEY: "test-node"}


def test_node_labels_for_pv_copies_only_present_keys() -> None:
    config = make_config(nodeLabelsForPV=["topology.kubernetes.io/zone", "missing/label", HOSTNAME_LABEL_KEY])
    assert pv_labels(NODE, config) == {
        "topology.kubernetes.io/zone": "zone-a",
        HOSTNAME_LABEL_KEY: "test-node-hostname",
        NODE_LABEL_KEY: "test-node",
    }


def test_labels_for_pv_win_over_node_labels() -> None:
    config = make_config(nodeLabelsForPV=["rack", "topology.kubernetes.io/zone"],
                         labelsForPV={"rack": "static-rack", "team": "storage"})
    assert pv_labels(NODE, config) == {
        "rack": "static-rack",
        "topology.kubernetes.io/zone": "zone-a",
        "team": "storage",
        NODE_LABEL_KEY: "test-node",
    }
    assert make_pv(config=config)["metadata"]["labels"] == pv_labels(NODE, config)


def test_our_node_label_cannot_be_overridden_by_config() -> None:
    # The informer selects on this label: a configured value would hide our own PVs from us.
    config = make_config(labelsForPV={NODE_LABEL_KEY: "other-node"})
    assert pv_labels(NODE, config)[NODE_LABEL_KEY] == "test-node"


def test_long_node_name_gets_a_valid_hashed_label_value() -> None:
    node = NodeInfo("n" * 100 + ".example.com", "u", {HOSTNAME_LABEL_KEY: "h"})
    value = pv_labels(node, make_config())[NODE_LABEL_KEY]
    assert value == node_label_value(node.name)
    assert len(value) <= 63
    assert value != node.name


def test_provisioned_by_uid_style() -> None:
    pv = make_pv(provisioner=provisioner_name("test-node", "node-uid-1", use_node_name_only=False))
    assert pv["metadata"]["annotations"] == {PROVISIONED_BY_ANNOTATION: "local-volume-provisioner-test-node-node-uid-1"}


def test_provisioned_by_node_name_only() -> None:
    config = make_config(useNodeNameOnly=True)
    pv = make_pv(config=config)
    assert pv["metadata"]["annotations"] == {PROVISIONED_BY_ANNOTATION: "local-volume-provisioner-test-node"}
    # useNodeNameOnly changes neither the name nor the affinity.
    assert pv["metadata"]["name"] == make_pv()["metadata"]["name"]
    assert pv["spec"]["nodeAffinity"] == make_pv()["spec"]["nodeAffinity"]


def test_owner_reference_to_node_when_configured() -> None:
    pv = make_pv(config=make_config(setPVOwnerRef=True))
    assert pv["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "test-node", "uid": "node-uid-1"}]
    # Upstream sets neither controller nor blockOwnerDeletion.
    assert set(pv["metadata"]["ownerReferences"][0]) == {"apiVersion", "kind", "name", "uid"}


def test_node_info_from_object() -> None:
    node = NodeInfo.from_object({"metadata": {"name": "n1", "uid": "u1", "labels": {HOSTNAME_LABEL_KEY: "h1"}}})
    assert node == NodeInfo("n1", "u1", {HOSTNAME_LABEL_KEY: "h1"})
    assert node.hostname == "h1"
    bare = NodeInfo.from_object({"metadata": {"name": "n2"}})
    assert bare.uid == "" and bare.hostname is None


# --------------------------------------------------------------------------- capacity


@pytest.mark.parametrize(
    ("size", "expected"),
    [
        (10 * GiB + 5, "10Gi"),
        (13 * GiB - 1, "12Gi"),
        (9 * GiB + 999 * MiB, "10215Mi"),
        (10000 * MiB - 1, "9999Mi"),
        (63 * MiB - 10, "62Mi"),
        (12345, "12345"),
        (3 * 1024 * GiB + 2 * GiB + MiB, "3074Gi"),
        (1024 * GiB, "1Ti"),
        (1536, "1536"),
        (2048, "2Ki"),
        (0, "0"),
    ],
)
def test_capacity_rounding_and_binary_si_format(size: int, expected: str) -> None:
    assert make_pv(capacity=size)["spec"]["capacity"] == {"storage": expected}


@given(st.integers(min_value=0, max_value=2**62))
def test_capacity_quantity_round_trips_to_rounded_bytes(size: int) -> None:
    text = make_pv(capacity=size)["spec"]["capacity"]["storage"]
    assert parse_quantity(text) == round_capacity(size)
    assert parse_quantity(text) <= size


def test_build_pv_returns_independent_objects() -> None:
    config = make_config(labelsForPV={"a": "b"})
    pv1 = make_pv(config=config)
    pv1["metadata"]["labels"]["a"] = "mutated"
    pv1["spec"]["accessModes"].append("ReadOnlyMany")
    pv2 = make_pv(config=config)
    assert pv2["metadata"]["labels"]["a"] == "b"
    assert pv2["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert config.labels_for_pv["a"] == "b"


def test_class_config_is_a_class_config() -> None:
    # Sanity of the builder helper: parse_config gives the defaults upstream documents.
    cls = make_config().classes["sc1"]
    assert isinstance(cls, ClassConfig)
    assert cls.volume_mode == "Filesystem"
    assert cls.access_mode == "ReadWriteOnce"
    assert cls.block_cleaner_command == ("/scripts/quick_reset.sh",)

"""The chart's dynamic pools and classes (issue 23): values that would make a bad volume fail
`helm install` with a message naming the value, checked with real Helm against the API emulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv_emulator.apiserver import ApiServer
from tests.conftest import NEEDS_XFS
from tests.helm.chart import NAMESPACE, RELEASE, Install, helm_runs, installed, load_values

DYNAMIC = load_values("dynamic-values.yaml")
DRIVER_NAME = DYNAMIC["dynamic"].get("driverName", "local.csi.localpv.dev")


def _dynamic(**changes: Any) -> dict[str, Any]:
    """The CI values of dynamic volumes with ``changes`` to their ``dynamic`` map."""
    return {**DYNAMIC, "dynamic": {**DYNAMIC["dynamic"], **changes}}


def _pool(**settings: Any) -> dict[str, Any]:
    return {"name": "fast", "hostDir": "/mnt/pools/fast", **settings}


SCENARIOS: dict[str, dict[str, Any]] = {
    "dynamic": DYNAMIC,
    "overcommit-100": _dynamic(pools=[_pool(overcommit=100)]),
    "overcommit-1000": _dynamic(pools=[_pool(overcommit=1000)]),
    "thin-discard": _dynamic(classes=[{"name": "d", "pool": "fast", "mountOptions": ["noatime", "discard"]}]),
    "thick-discard": _dynamic(classes=[{"name": "d", "pool": "fast", "provisioning": "thick",
                                        "mountOptions": ["noatime", "discard"]}]),
    "two-pools-one-dir": _dynamic(pools=[_pool(), _pool(name="slow", hostDir="/mnt/pools//fast/")]),
    "nested-pools": _dynamic(pools=[_pool(), _pool(name="inner", hostDir="/mnt/pools/fast/inner")]),
    "two-pools-one-mount-dir": _dynamic(pools=[_pool(), _pool(name="slow", hostDir="/mnt/slow",
                                                             mountDir="/mnt/pools/fast")]),
    "pools-side-by-side": _dynamic(pools=[_pool(), _pool(name="fast2", hostDir="/mnt/pools/fast2")]),
    "unknown-pool": _dynamic(classes=[{"name": "d", "pool": "slow"}]),
    # Several kubelets on one host (test clusters), a state disk shared by the nodes.
    "per-node-dirs": {**_dynamic(kubeletDir="/data/nodes/$(NODE_NAME)/kubelet"),
                      "agent": {"stateDir": "/srv/localpv-state/$(NODE_NAME)"}},
    "node-name-at-the-root": {**DYNAMIC, "agent": {"stateDir": "/$(NODE_NAME)/localpv"}},
    "another-variable": _dynamic(kubeletDir="/data/nodes/$(HOSTNAME)/kubelet"),
    "state-and-kubelet-from-one-dir": {**_dynamic(kubeletDir="/data/$(NODE_NAME)/kubelet"),
                                       "agent": {"stateDir": "/data/$(NODE_NAME)/localpv"}},
    "no-capacity-tracking": _dynamic(storageCapacity=False),
}
#: Each refused scenario and the words its message must hold.
REFUSED: dict[str, list[str]] = {
    "overcommit-1000": ["overcommit", "want 100"],
    "thick-discard": ['dynamic.classes[0].mountOptions: expected no "discard" in a thick class (d)',
                      "punch holes", "found noatime, discard"],
    "two-pools-one-dir": ["dynamic.pools[1].hostDir: expected a directory apart from every other pool's, found "
                          "/mnt/pools/fast, the same directory as dynamic.pools[0].hostDir"],
    "nested-pools": ["dynamic.pools[1].hostDir: expected a directory apart from every other pool's, found "
                     "/mnt/pools/fast/inner, inside dynamic.pools[0].hostDir (/mnt/pools/fast)"],
    "two-pools-one-mount-dir": ["dynamic.pools[1].mountDir: expected a directory apart from every other pool's, "
                                "found /mnt/pools/fast, the same directory as dynamic.pools[0].mountDir"],
    "unknown-pool": ['dynamic.classes[0].pool: expected a pool of dynamic.pools (fast), found "slow"'],
    "node-name-at-the-root": ["agent.stateDir: expected $(NODE_NAME) below a directory of the host",
                              "found it in the first component of /$(NODE_NAME)/localpv"],
    "another-variable": ["dynamic.kubeletDir: expected $(NODE_NAME) as the only variable (the node's name), "
                         "found /data/nodes/$(HOSTNAME)/kubelet"],
    "state-and-kubelet-from-one-dir": ["agent.stateDir: expected a host directory apart from dynamic.kubeletDir's, "
                                       "found both mounted from /data"],
}


def _csidriver_of_an_earlier_build(policy: str | None, capacity: bool | None = None) -> dict[str, Any]:
    """The CSIDriver as a build before fsGroupPolicy File (or before storageCapacity) left it,
    owned by the same release (so that Helm takes it over), with the policy the API server gave
    it (None: dropped) and its storageCapacity (None: none)."""
    spec: dict[str, Any] = {"attachRequired": False, "podInfoOnMount": False, "volumeLifecycleModes": ["Persistent"]}
    if policy is not None:
        spec["fsGroupPolicy"] = policy
    if capacity is not None:
        spec["storageCapacity"] = capacity
    return {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
            "metadata": {"name": DRIVER_NAME, "labels": {"app.kubernetes.io/managed-by": "Helm"},
                         "annotations": {"meta.helm.sh/release-name": RELEASE,
                                         "meta.helm.sh/release-namespace": NAMESPACE}},
            "spec": spec}


#: Upgrades over a CSIDriver an earlier build made: (Kubernetes version, its fsGroupPolicy).
UPGRADES: dict[str, tuple[str, str | None]] = {
    "over-default-policy@1.20": ("1.20.0", "ReadWriteOnceWithFSType"),
    "over-no-policy@1.20": ("1.20.0", None),
    "over-default-policy@1.28": ("1.28.0", "ReadWriteOnceWithFSType"),
    "over-default-policy@1.29": ("1.29.0", "ReadWriteOnceWithFSType"),
}


#: Upgrades over a CSIDriver an earlier build made: (Kubernetes version, its storageCapacity).
CAPACITY_UPGRADES: dict[str, tuple[str, bool | None]] = {
    "capacity-over-none@1.20": ("1.20.0", None),
    "capacity-over-false@1.22": ("1.22.0", False),
    "capacity-over-none@1.23": ("1.23.0", None),
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values) for name, values in SCENARIOS.items()}
    for name, (version, policy) in UPGRADES.items():
        done[name] = Install(DYNAMIC, server=ApiServer(binder=True, kube_version=version),
                             existing=[_csidriver_of_an_earlier_build(policy)])
    for name, (version, capacity) in CAPACITY_UPGRADES.items():
        done[name] = Install(DYNAMIC, server=ApiServer(binder=True, kube_version=version),
                             existing=[_csidriver_of_an_earlier_build("File", capacity)])
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        yield installs


@pytest.mark.parametrize("name", sorted(set(SCENARIOS) - set(REFUSED)))
def test_good_dynamic_values_install(installs: dict[str, Install], name: str) -> None:
    assert installs[name].error is None, installs[name].error


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_dynamic_values_fail_the_install_naming_the_value(installs: dict[str, Install], name: str) -> None:
    inst = installs[name]
    assert inst.error is not None, f"{name}: Helm accepted values it must refuse"
    for word in REFUSED[name]:
        assert word in inst.error, f"{name}: message does not name {word!r}: {inst.error}"
    assert not inst.server.list("apps/v1", "DaemonSet", NAMESPACE), "a refused install created objects"


@NEEDS_XFS
def test_config_check_tries_the_charts_mkfs_options_and_accepts_them(installs: dict[str, Install],
                                                                    tmp_path: Path) -> None:
    """The ConfigMap the chart writes, as the kubelet mounts it, passes `localpv config check`,
    whose mkfs trial runs each class's mkfsOptions with the real mkfs."""
    data = installed(installs, "dynamic").one("v1", "ConfigMap")["data"]
    for key, value in data.items():
        (tmp_path / key).write_text(value)
    result = CliRunner().invoke(cli, ["config", "check", str(tmp_path)])
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    assert "-m reflink=0" in result.stdout


def test_the_csi_driver_has_the_kubelet_apply_fsgroup_to_every_volume(installs: dict[str, Install]) -> None:
    """fsGroupPolicy File (issue 26): left at its default, ReadWriteOnceWithFSType, the kubelet
    applies a pod's fsGroup only to volumes whose access modes hold ReadWriteOnce, so a non-root
    pod with fsGroup got a ReadWriteOncePod dynamic volume it could not write. Each image is
    one pod's filesystem, made by localpv: changing its ownership is always right."""
    inst = installed(installs, "dynamic")
    [rendered] = inst.rendered("CSIDriver")
    assert rendered["spec"]["fsGroupPolicy"] == "File"
    assert inst.one("storage.k8s.io/v1", "CSIDriver")["spec"]["fsGroupPolicy"] == "File"


@pytest.mark.parametrize("name", sorted(UPGRADES))
def test_an_existing_csidriver_keeps_its_policy_where_it_cannot_change(installs: dict[str, Install],
                                                                       name: str) -> None:
    """Before Kubernetes 1.29 a CSIDriver's spec is immutable: a `helm upgrade` from a build
    without fsGroupPolicy failed on it ("spec: ... field is immutable", seen on 1.20 by
    tests/e2e/test_upgrade.py) after updating the other objects. The chart keeps the existing
    object's value there (and says how to get File); from 1.29 it sets File."""
    version, policy = UPGRADES[name]
    inst = installed(installs, name)
    [rendered] = inst.rendered("CSIDriver")
    if version >= "1.29":
        assert rendered["spec"]["fsGroupPolicy"] == "File"
        assert "keeps fsGroupPolicy" not in inst.notes
        return
    assert rendered["spec"].get("fsGroupPolicy") == policy
    assert f"keeps fsGroupPolicy {policy or '(none)'}" in inst.notes
    assert f"kubectl delete csidriver {DRIVER_NAME}" in inst.notes


def test_a_dir_that_names_the_node_mounts_the_dir_above_and_gives_the_agent_its_nodes_path(
        installs: dict[str, Install]) -> None:
    """Two kubelets on one host (realk8s's two nodes) have two root dirs, and two agents on one
    state dir exit but one: `$(NODE_NAME)` in agent.stateDir and dynamic.kubeletDir. A
    DaemonSet's hostPath cannot name the node, so the directory above it is mounted, at the
    same path (the kubelet's target paths must resolve in the container), and the agent gets
    the path with `$(MY_NODE_NAME)`, which the kubelet expands in args and in env values from
    variables defined before them."""
    ds = installed(installs, "per-node-dirs").one("apps/v1", "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert "--state-dir=/srv/localpv-state/$(MY_NODE_NAME)" in agent["args"]
    assert volumes["state"] == {"path": "/srv/localpv-state", "type": "DirectoryOrCreate"}
    assert mounts["state"]["mountPath"] == "/srv/localpv-state"
    env = [e["name"] for e in agent["env"]]
    [kubelet_env] = [e for e in agent["env"] if e["name"] == "LOCALPV_KUBELET_DIR"]
    assert kubelet_env["value"] == "/data/nodes/$(MY_NODE_NAME)/kubelet"
    assert env.index("MY_NODE_NAME") < env.index("LOCALPV_KUBELET_DIR"), env
    assert volumes["kubelet-dir"] == {"path": "/data/nodes", "type": "Directory"}
    assert mounts["kubelet-dir"]["mountPath"] == "/data/nodes"
    assert mounts["kubelet-dir"]["mountPropagation"] == "Bidirectional"


def test_dirs_without_the_node_name_are_mounted_as_they_are(installs: dict[str, Install]) -> None:
    ds = installed(installs, "dynamic").one("apps/v1", "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    [agent] = pod["containers"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    assert volumes["kubelet-dir"] == "/var/lib/kubelet" and volumes["state"] == "/var/lib/localpv"
    assert {"name": "LOCALPV_KUBELET_DIR", "value": "/var/lib/kubelet"} in agent["env"]
    assert "--state-dir=/var/lib/localpv" in agent["args"]


def _capacity_env(inst: Install) -> str:
    [ds] = inst.rendered("DaemonSet")
    [agent] = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "provisioner"]
    return str(next(e["value"] for e in agent["env"] if e["name"] == "LOCALPV_CAPACITY_TRACKING"))


def test_capacity_tracking_is_on_by_default_with_its_rbac(installs: dict[str, Install]) -> None:
    """The CSIDriver says storageCapacity: true, the agents are told to publish, and may write
    CSIStorageCapacity objects in the release namespace only (a Role, no cluster-wide grant)."""
    inst = installed(installs, "dynamic")
    assert inst.one("storage.k8s.io/v1", "CSIDriver")["spec"]["storageCapacity"] is True
    assert _capacity_env(inst) == "true"
    [role] = [r for r in inst.rendered("Role") if "capacity" in r["metadata"]["name"]]
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": ["storage.k8s.io"], "resources": ["csistoragecapacities"],
                              "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}]
    [binding] = [b for b in inst.rendered("RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["metadata"]["namespace"] == NAMESPACE
    for cluster_role in inst.rendered("ClusterRole"):
        assert all("csistoragecapacities" not in r["resources"] for r in cluster_role["rules"])


def test_capacity_tracking_off_publishes_nothing_and_grants_nothing(installs: dict[str, Install]) -> None:
    inst = installed(installs, "no-capacity-tracking")
    assert inst.one("storage.k8s.io/v1", "CSIDriver")["spec"]["storageCapacity"] is False
    assert _capacity_env(inst) == "false"
    assert not [r for r in inst.rendered("Role") if "capacity" in r["metadata"]["name"]]


@pytest.mark.parametrize("name", sorted(CAPACITY_UPGRADES))
def test_an_existing_csidriver_keeps_its_storage_capacity_where_it_cannot_change(
        installs: dict[str, Install], name: str) -> None:
    """Before Kubernetes 1.23 storageCapacity cannot change on an existing CSIDriver: a `helm
    upgrade` from a build without it would fail there ("field is immutable"). The chart keeps
    the existing value (none: the field left out) and says how to change it; from 1.23 it sets
    the value."""
    version, capacity = CAPACITY_UPGRADES[name]
    inst = installed(installs, name)
    [rendered] = inst.rendered("CSIDriver")
    if version >= "1.23":
        assert rendered["spec"]["storageCapacity"] is True
        assert "keeps storageCapacity" not in inst.notes
        return
    assert rendered["spec"].get("storageCapacity") == capacity
    kept = "(none: false)" if capacity is None else str(capacity).lower()
    assert f"keeps storageCapacity {kept}" in inst.notes
    assert "keeps fsGroupPolicy" not in inst.notes  # its fsGroupPolicy was File already

"""The chart, installed with real Helm into the API emulator, with our values and with
values files written in the upstream charts' formats (helm/localpv/ci/).

Every scenario is installed once per module, all in one Helm process (each into its own
emulator), and the tests read what the emulator stored and what Helm rendered.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from click.testing import CliRunner

from localpv.cli import cli
from localpv.config import load_config
from localpv.doctor import required_access
from localpv.naming import NODE_LABEL_KEY
from tests.helm.chart import (
    ALL_FEATURES,
    CHART,
    CI_VALUES,
    NAMESPACE,
    SCHEMA_VERSIONS,
    Install,
    helm_runs,
    installed,
    lint,
    load_values,
)

Obj = dict[str, Any]

CI_FILES = sorted(p.name for p in CI_VALUES.glob("*-values.yaml"))
AGENT_FILES = [f for f in CI_FILES if f != "nfs-subdir-values.yaml"]

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **{name: load_values(name) for name in CI_FILES},
    "config-changed": {"classes": [{"name": "fast-disks", "hostDir": "/mnt/other"}]},
    "labels-changed": {"podLabels": {"rollout": "2"}},
    "templated-topology": {"classes": [{
        "name": "zoned", "hostDir": "/mnt/zoned", "storageClass": True,
        "allowedTopologies": "- matchLabelExpressions:\n  - key: topology.kubernetes.io/zone\n"
                             "    values: [\"{{ .Release.Namespace }}-a\"]"}]},
    "os-selector": {"nodeSelector": {"kubernetes.io/os": "linux", "disk": "ssd"}},
    "shared-mount-dir": {"classes": [{"name": "a", "hostDir": "/mnt/disks"},
                                     {"name": "b", "hostDir": "/mnt/disks", "namePattern": "b-*"}]},
    # values Helm must refuse, each with a message that names the problem
    "bad-volume-mode": {"classes": [{"name": "x", "hostDir": "/mnt/x", "volumeMode": "block"}]},
    "typo-top-level": {"useJobsForCleaning": True},
    "typo-class-key": {"classes": [{"name": "x", "hostdir": "/mnt/x"}]},
    "relative-host-dir": {"classes": [{"name": "x", "hostDir": "mnt/x"}]},
    "bad-on-delete": {"nfs": {"server": "nfs.example.com"}, "storageClass": {"onDelete": "archive"}},
    "bad-cluster-id": {"nfs": {"server": "nfs.example.com", "clusterId": "prod cluster"}},
    "bad-duration": {"minResyncPeriod": "five minutes"},
    "windows": {"enableWindows": True},
    "no-classes": {"classes": []},
    # a surge pod would be a second agent on the node's journal (issue 26.3)
    "surge": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 1}}},
    "surge-percent": {"updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "10%"}}},
}
REFUSED = {
    "bad-volume-mode": ["volumeMode", "Filesystem", "Block"],
    "typo-top-level": ["useJobsForCleaning"],
    "typo-class-key": ["hostdir"],
    "relative-host-dir": ["hostDir"],
    "bad-on-delete": ["onDelete"],
    "bad-cluster-id": ["clusterId"],
    "bad-duration": ["minResyncPeriod"],
    "windows": ["enableWindows", "Windows"],
    "no-classes": ["classes", "agent.enabled=false"],
    "surge": ["updateStrategy.rollingUpdate.maxSurge", "second agent", "found 1"],
    "surge-percent": ["updateStrategy.rollingUpdate.maxSurge", "found 10%"],
}


@pytest.fixture(scope="module")
def installs(helm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Install]]:
    done = {name: Install(values) for name, values in SCENARIOS.items()}
    with helm_runs(helm_python, done, tmp_path_factory.mktemp("helm")) as installs:
        yield installs


def container(obj: Obj) -> Obj:
    [c] = obj["spec"]["template"]["spec"]["containers"]
    return dict(c)


# ---------------------------------------------------------------- every values file


@pytest.mark.parametrize("name", ["defaults", *CI_FILES])
def test_values_file_installs_and_every_object_is_stored(installs: dict[str, Install], name: str) -> None:
    inst = installed(installs, name)
    assert inst.manifests, "nothing rendered"
    for obj in inst.manifests:
        meta = obj["metadata"]
        namespace = meta.get("namespace") if "namespace" in meta else None
        stored = inst.server.get(obj["apiVersion"], obj["kind"], meta["name"], namespace)
        assert stored is not None, f"{obj['kind']} {meta['name']} was rendered but not created"


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("name", ["defaults", *CI_FILES])
def test_rendered_manifests_are_valid_kubernetes_objects(installs: dict[str, Install], name: str,
                                                         version: str) -> None:
    """Strict validation against the Kubernetes OpenAPI schemas of several releases (offline,
    kubernetes-validate): unknown fields, wrong types and API versions a release no longer
    serves fail, which the emulator does not check everywhere."""
    problems = []
    for obj in installed(installs, name).manifests:
        if obj["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: no schema in the Kubernetes set (checked in its own test)
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            problems.append(f"{obj['kind']} {obj['metadata']['name']}: {str(err).splitlines()[0]} at {list(err.path)}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
def test_schema_validation_catches_a_bad_manifest(version: str) -> None:
    """The validator used above does fail on what the chart must never render: a misplaced field,
    and an API version the release no longer serves (policy/v1beta1 went in 1.25)."""
    ds = {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "x"},
          "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {
              "metadata": {"labels": {"a": "b"}},
              "spec": {"containers": [{"name": "c", "image": "i", "mountPropagation": "HostToContainer"}]}}}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, version, strict=True)
    pdb = {"apiVersion": "policy/v1beta1", "kind": "PodDisruptionBudget", "metadata": {"name": "x"},
           "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"a": "b"}}}}
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(pdb, version, strict=True)


def test_one_values_file_renders_every_template(installs: dict[str, Install]) -> None:
    """The schema validation above sees every object the chart can make: the all-features
    install renders each template that makes objects."""
    templates = {p.name for p in (CHART / "templates").glob("*.yaml")}
    manifest = installed(installs, ALL_FEATURES).result["manifest"]
    rendered = set(re.findall(r"^# Source: localpv/templates/(\S+)$", manifest, re.M))
    assert rendered == templates, f"not rendered with {ALL_FEATURES}: {sorted(templates - rendered)}"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_wrong_values_fail_the_install_with_a_clear_message(installs: dict[str, Install], name: str) -> None:
    inst = installs[name]
    assert inst.error is not None, f"{name}: Helm accepted values it must refuse"
    for word in REFUSED[name]:
        assert word in inst.error, f"{name}: message does not name {word!r}: {inst.error}"
    assert not inst.server.list("apps/v1", "DaemonSet", NAMESPACE), "a refused install created objects"


# ---------------------------------------------------------------- the agent's ConfigMap


def _config_dir(inst: Install, tmp_path: Path) -> Path:
    """The ConfigMap as the kubelet mounts it: one file per key."""
    cm = inst.one("v1", "ConfigMap", "lp-localpv-config")
    target = tmp_path / "config"
    target.mkdir()
    for key, value in cm["data"].items():
        (target / key).write_text(value)
    return target


@pytest.mark.parametrize("name", ["defaults", *AGENT_FILES])
def test_configmap_is_accepted_by_the_agent_without_warnings(
        installs: dict[str, Install], name: str, tmp_path: Path) -> None:
    inst = installed(installs, name)
    loaded = load_config(_config_dir(inst, tmp_path))
    assert loaded.warnings == ()
    classes = {c["name"]: c for c in inst.values.get("classes", SCENARIOS["defaults"].get("classes") or [])}
    expected = classes or {"fast-disks": {"name": "fast-disks", "hostDir": "/mnt/fast-disks"}}
    assert sorted(loaded.config.classes) == sorted(expected)
    for cls_name, cls in expected.items():
        parsed = loaded.config.classes[cls_name]
        assert parsed.host_dir == cls["hostDir"]
        assert parsed.mount_dir == cls.get("mountDir", cls["hostDir"])
        assert parsed.volume_mode == cls.get("volumeMode", "Filesystem")
        if "blockCleanerCommand" in cls:
            assert parsed.block_cleaner_command == tuple(str(a) for a in cls["blockCleanerCommand"])


def test_upstream_settings_reach_the_agent(installs: dict[str, Install], tmp_path: Path) -> None:
    inst = installed(installs, "upstream-baremetal-values.yaml")
    config = load_config(_config_dir(inst, tmp_path)).config
    values = inst.values
    assert config.use_node_name_only and config.set_pv_owner_ref
    assert config.min_resync_period == 600
    assert config.node_labels_for_pv == tuple(values["nodeLabels"])
    assert dict(config.labels_for_pv) == values["labelsForPV"]
    assert [dict(t) for t in config.job_tolerations] == values["tolerations"]
    assert not config.use_job_for_cleaning
    assert config.classes["local-ssd"].name_pattern.spec == "ssd-*,nvme-*"


def test_job_cleaning_is_written_in_upstreams_format(installs: dict[str, Install], tmp_path: Path) -> None:
    inst = installed(installs, "upstream-block-jobs-values.yaml")
    data = inst.one("v1", "ConfigMap", "lp-localpv-config")["data"]
    assert data["useJobForCleaning"] == "true"  # upstream's chart writes "yes"; the agent reads both
    config = load_config(_config_dir(inst, tmp_path)).config
    assert config.use_job_for_cleaning and config.remove_node_not_ready_taint
    assert config.classes["nvme-shared"].selector[0]["matchExpressions"][0]["values"] == ["rack-7"]


def test_localpv_settings_reach_the_agent(installs: dict[str, Install], tmp_path: Path) -> None:
    config = load_config(_config_dir(installed(installs, "everything-values.yaml"), tmp_path)).config
    assert config.use_job_for_filesystem_cleaning and config.clean_before_first_discovery
    assert config.cleanup_workers == 2 and config.cleanup_timeout == 7200


def test_config_check_command_accepts_the_mounted_configmap(installs: dict[str, Install], tmp_path: Path) -> None:
    directory = _config_dir(installed(installs, "upstream-block-jobs-values.yaml"), tmp_path)
    result = CliRunner().invoke(cli, ["config", "check", str(directory)])
    assert result.exit_code == 0, result.output
    assert "nvme-block" in result.output and "warning" not in result.output


# ---------------------------------------------------------------- the agent DaemonSet


def test_daemonset_mounts_each_discovery_dir_with_host_to_container_propagation(installs: dict[str, Install]) -> None:
    inst = installed(installs, "upstream-baremetal-values.yaml")
    ds = inst.one("apps/v1", "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(ds)["volumeMounts"]}
    for cls in inst.values["classes"]:
        mount = mounts[cls.get("mountDir", cls["hostDir"])]
        assert mount["mountPropagation"] == "HostToContainer"
        assert volumes[mount["name"]]["hostPath"]["path"] == cls["hostDir"]
    assert mounts["/dev"]["name"] == "dev" and volumes["dev"]["hostPath"]["path"] == "/dev"
    assert mounts["/etc/provisioner/config"]["readOnly"] is True
    state = mounts["/var/lib/localpv"]
    assert volumes[state["name"]]["hostPath"] == {"path": "/var/lib/localpv", "type": "DirectoryOrCreate"}
    assert "--state-dir=/var/lib/localpv" in container(ds)["args"]


def test_a_node_selector_that_names_the_os_too(installs: dict[str, Install]) -> None:
    ds = installed(installs, "os-selector").one("apps/v1", "DaemonSet")
    assert ds["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux", "disk": "ssd"}


def test_two_classes_sharing_a_directory_mount_it_once(installs: dict[str, Install]) -> None:
    ds = installed(installs, "shared-mount-dir").one("apps/v1", "DaemonSet")
    paths = [m["mountPath"] for m in container(ds)["volumeMounts"]]
    assert paths.count("/mnt/disks") == 1


def test_dev_mount_is_optional(installs: dict[str, Install]) -> None:
    ds = installed(installs, "upstream-extras-values.yaml").one("apps/v1", "DaemonSet")
    assert "/dev" not in [m["mountPath"] for m in container(ds)["volumeMounts"]]
    assert "/host/mnt" in [m["mountPath"] for m in container(ds)["volumeMounts"]]
    assert [c["name"] for c in ds["spec"]["template"]["spec"]["initContainers"]] == ["prepare-disks"]


def test_the_agent_reads_udev_read_only_and_looks_at_volume_health_on_a_period(installs: dict[str, Install]) -> None:
    """Disk identities (WWN, serial) come from udev's database, mounted read-only; a node
    without udev gets an empty directory instead of a pod that cannot start."""
    ds = installed(installs, "defaults").one("apps/v1", "DaemonSet")
    agent = container(ds)
    [mount] = [m for m in agent["volumeMounts"] if m["mountPath"] == "/run/udev"]
    assert mount["readOnly"] is True
    [volume] = [v for v in ds["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["hostPath"] == {"path": "/run/udev", "type": "DirectoryOrCreate"}
    assert "--volume-health-period=60s" in agent["args"]


def test_agent_environment_comes_from_the_downward_api_and_jobs_use_the_same_image(
        installs: dict[str, Install]) -> None:
    for name in ("defaults", "everything-values.yaml"):
        c = container(installed(installs, name).one("apps/v1", "DaemonSet"))
        env = {e["name"]: e for e in c["env"]}
        assert env["MY_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
        assert env["MY_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
        assert env["JOB_CONTAINER_IMAGE"]["value"] == c["image"]
        assert c["args"][0] == "agent"
    everything = container(installed(installs, "everything-values.yaml").one("apps/v1", "DaemonSet"))
    image = load_values("everything-values.yaml")["image"]
    assert everything["image"] == f"{image['repository']}:{image['tag']}"
    assert everything["imagePullPolicy"] == "IfNotPresent"


def test_probes_use_healthz_and_ready(installs: dict[str, Install]) -> None:
    c = container(installed(installs, "defaults").one("apps/v1", "DaemonSet"))
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in c["ports"]
    upstream_style = container(installed(installs, "upstream-extras-values.yaml").one("apps/v1", "DaemonSet"))
    assert upstream_style["livenessProbe"]["tcpSocket"] == {"port": "metrics"}
    assert "httpGet" not in upstream_style["livenessProbe"]  # one handler: the values' own
    assert upstream_style["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_pods_roll_when_the_configuration_changes_and_only_then(installs: dict[str, Install]) -> None:
    def checksum(name: str) -> str:
        ds = installed(installs, name).one("apps/v1", "DaemonSet")
        return str(ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"])

    assert checksum("defaults") != checksum("config-changed")
    assert checksum("defaults") == checksum("labels-changed")
    assert len(checksum("defaults")) == len(hashlib.sha256().hexdigest())


def test_security_context_is_privileged_root_by_default_and_overridable(installs: dict[str, Install]) -> None:
    default = container(installed(installs, "defaults").one("apps/v1", "DaemonSet"))["securityContext"]
    assert default == {"privileged": True, "runAsUser": 0}
    custom = container(installed(installs, "upstream-block-jobs-values.yaml").one("apps/v1", "DaemonSet"))
    assert custom["securityContext"] == {"allowPrivilegeEscalation": True, "capabilities": {"add": ["SYS_ADMIN"]},
                                         "privileged": True, "runAsUser": 0}


def test_scheduling_values_reach_the_pod(installs: dict[str, Install]) -> None:
    inst = installed(installs, "upstream-baremetal-values.yaml")
    pod = inst.one("apps/v1", "DaemonSet")["spec"]["template"]
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux", "node-pool": "storage"}
    assert spec["tolerations"] == inst.values["tolerations"]
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["imagePullSecrets"] == [{"name": "registry-credentials"}]
    assert pod["metadata"]["labels"]["team"] == "platform"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert container(inst.one("apps/v1", "DaemonSet"))["resources"]["limits"] == {"memory": "256Mi"}
    jobs = installed(installs, "upstream-block-jobs-values.yaml").one("apps/v1", "DaemonSet")
    assert jobs["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 2
    startup_taint = {"key": "sig-storage-local-static-provisioner/agent-not-ready", "operator": "Exists"}
    assert startup_taint in jobs["spec"]["template"]["spec"]["tolerations"]


# ---------------------------------------------------------------- StorageClasses


def test_storage_classes_follow_the_class_list(installs: dict[str, Install]) -> None:
    inst = installed(installs, "upstream-baremetal-values.yaml")
    classes = {sc["metadata"]["name"]: sc for sc in inst.server.list("storage.k8s.io/v1", "StorageClass")}
    assert sorted(classes) == ["local-hdd", "local-ssd"]
    for sc in classes.values():
        assert sc["volumeBindingMode"] == "WaitForFirstConsumer"
        assert sc["provisioner"] == "kubernetes.io/no-provisioner"
    assert classes["local-ssd"]["reclaimPolicy"] == "Retain"
    assert classes["local-ssd"]["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert classes["local-hdd"]["reclaimPolicy"] == "Delete"
    # no `storageClass` in a class: no StorageClass object (upstream's default)
    assert installed(installs, "defaults").server.list("storage.k8s.io/v1", "StorageClass") == []


def test_storage_class_topology_and_provisioner_override(installs: dict[str, Install]) -> None:
    sc = installed(installs, "upstream-block-jobs-values.yaml").one("storage.k8s.io/v1", "StorageClass", "nvme-block")
    [term] = sc["allowedTopologies"]
    assert term["matchLabelExpressions"][0]["values"] == ["i3.large", "i3.xlarge"]
    templated = installed(installs, "templated-topology").one("storage.k8s.io/v1", "StorageClass", "zoned")
    assert templated["allowedTopologies"] == [{"matchLabelExpressions": [
        {"key": "topology.kubernetes.io/zone", "values": [f"{NAMESPACE}-a"]}]}]
    hint = installed(installs, "everything-values.yaml").one("storage.k8s.io/v1", "StorageClass", "local-block")
    assert hint["provisioner"] == "example.com/local-autoscaler-hint"


# ---------------------------------------------------------------- RBAC


def _rules(inst: Install) -> list[Obj]:
    roles = inst.server.list("rbac.authorization.k8s.io/v1", "ClusterRole")
    roles += inst.server.list("rbac.authorization.k8s.io/v1", "Role", NAMESPACE)
    return [rule for role in roles for rule in role.get("rules") or []]


@pytest.mark.parametrize("name", ["defaults", *CI_FILES])
def test_rbac_has_no_wildcards(installs: dict[str, Install], name: str) -> None:
    for rule in _rules(installed(installs, name)):
        for field in ("verbs", "resources", "apiGroups"):
            assert "*" not in rule.get(field, []), f"wildcard {field} in {rule}"
        assert "escalate" not in rule["verbs"] and "bind" not in rule["verbs"]


def _granted(inst: Install, role_kind: str) -> dict[str, set[str]]:
    roles = inst.server.list("rbac.authorization.k8s.io/v1", role_kind, NAMESPACE if role_kind == "Role" else None)
    return {f"{g}/{r}" if g else r: set(rule["verbs"])
            for role in roles for rule in role.get("rules") or []
            for g in rule["apiGroups"] for r in rule["resources"]}


def test_job_permissions_only_with_job_cleaning(installs: dict[str, Install]) -> None:
    with_jobs = installed(installs, "upstream-block-jobs-values.yaml")
    assert _granted(with_jobs, "Role")["batch/jobs"] == {"get", "list", "watch", "create", "delete"}
    binding = with_jobs.one("rbac.authorization.k8s.io/v1", "RoleBinding")
    assert binding["subjects"][0]["name"] == with_jobs.one("apps/v1", "DaemonSet")["spec"]["template"]["spec"][
        "serviceAccountName"]
    for name in ("defaults", "upstream-baremetal-values.yaml"):
        inst = installed(installs, name)
        assert not any("jobs" in key for key in {**_granted(inst, "Role"), **_granted(inst, "ClusterRole")})


def test_lease_permissions_only_for_nfs_with_leader_election(installs: dict[str, Install]) -> None:
    nfs = installed(installs, "nfs-subdir-values.yaml")
    assert _granted(nfs, "Role")["coordination.k8s.io/leases"] == {"get", "create", "update"}
    for name in ("defaults", *AGENT_FILES):
        inst = installed(installs, name)
        elects = bool((inst.values.get("nfs") or {}).get("server")) and \
            (inst.values.get("leaderElection") or {}).get("enabled", True)
        granted = any("leases" in key for key in {**_granted(inst, "Role"), **_granted(inst, "ClusterRole")})
        assert granted == elects, name


def test_the_nfs_provisioner_may_read_kube_system_only_when_it_derives_the_cluster_id(
        installs: dict[str, Install]) -> None:
    """Its uid is the default cluster id; with nfs.clusterId set nothing reads it."""
    derived = installed(installs, "nfs-subdir-values.yaml")
    rules = [r for r in derived.one("rbac.authorization.k8s.io/v1", "ClusterRole", "lp-localpv-nfs-runner")["rules"]
             if "namespaces" in r["resources"]]
    assert rules == [{"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"],
                      "verbs": ["get"]}]
    env = {e["name"] for e in container(derived.one("apps/v1", "Deployment"))["env"]}
    assert "LOCALPV_CLUSTER_ID" not in env

    given = installed(installs, "everything-values.yaml")
    assert not [r for r in _rules(given) if "namespaces" in r["resources"]]
    env_values = {e["name"]: e.get("value") for e in container(given.one("apps/v1", "Deployment",
                                                                          "lp-localpv-nfs"))["env"]}
    assert env_values["LOCALPV_CLUSTER_ID"] == "0f3c5d2e-8a41-4b7e-9c55-2d6f1e0a9b13"


def test_agent_role_is_least_privilege(installs: dict[str, Install]) -> None:
    granted = _granted(installed(installs, "defaults"), "ClusterRole")
    assert granted == {
        "persistentvolumes": {"get", "list", "watch", "create", "patch", "delete"},
        "storage.k8s.io/storageclasses": {"get", "list", "watch"},
        "nodes": {"get", "list", "watch"},  # follows its own Node (re-created: new uid)
        "events": {"create", "patch"},
    }
    tainted = _granted(installed(installs, "upstream-block-jobs-values.yaml"), "ClusterRole")
    assert tainted["nodes"] == {"get", "list", "watch", "update"}  # removeNodeNotReadyTaint edits its own Node


def test_no_rbac_objects_when_disabled(installs: dict[str, Install]) -> None:
    inst = installed(installs, "upstream-extras-values.yaml")
    assert _rules(inst) == []
    assert inst.server.list("v1", "ServiceAccount", NAMESPACE) == [] or all(
        sa["metadata"]["name"] == "default" for sa in inst.server.list("v1", "ServiceAccount", NAMESPACE))
    pod = inst.one("apps/v1", "DaemonSet")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "storage-agent"


def test_node_cleanup_has_its_own_account_and_only_it_may_delete_claims(installs: dict[str, Install]) -> None:
    inst = installed(installs, "everything-values.yaml")
    deploy = inst.one("apps/v1", "Deployment", "lp-localpv-node-cleanup")
    spec = deploy["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "lp-localpv-node-cleanup"
    args = container(deploy)["args"]
    assert args[0] == "node-cleanup"
    assert "--storageclass-names=local-fs,local-block" in args and "--pvc-deletion-delay=5m" in args
    assert {"--out-of-service-taint", "--out-of-service-delay=10m", "--no-delete-pods"} <= set(args)
    assert "--csi-driver-name=local.csi.localpv.dev" in args
    assert container(deploy)["securityContext"]["runAsNonRoot"] is True
    role = inst.one("rbac.authorization.k8s.io/v1", "ClusterRole", "lp-localpv-node-cleanup")
    assert not [r for r in role["rules"] if "pods" in r["resources"]]  # podDeletion: false
    claims = [r for r in role["rules"] if "persistentvolumeclaims" in r["resources"]]
    assert claims and "delete" in claims[0]["verbs"]
    for other in inst.server.list("rbac.authorization.k8s.io/v1", "ClusterRole"):
        if other["metadata"]["name"] != "lp-localpv-node-cleanup":
            for rule in other["rules"]:
                assert not ("persistentvolumeclaims" in rule["resources"] and "delete" in rule["verbs"]), other


# ---------------------------------------------------------------- NFS, Service, ServiceMonitor


def test_nfs_subdir_values_give_an_nfs_only_release_with_upstreams_env(installs: dict[str, Install]) -> None:
    inst = installed(installs, "nfs-subdir-values.yaml")
    assert inst.server.list("apps/v1", "DaemonSet", NAMESPACE) == []
    deploy = inst.one("apps/v1", "Deployment")
    assert deploy["spec"]["replicas"] == 2 and deploy["spec"]["strategy"]["type"] == "Recreate"
    c = container(deploy)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["NFS_SERVER"] == "10.0.0.20" and env["NFS_PATH"] == "/exports/k8s"
    assert env["PROVISIONER_NAME"] == "cluster.local/lp-localpv"
    assert "ENABLE_LEADER_ELECTION" not in env  # enabled is the default
    assert c["args"][0] == "nfs"
    assert {"name": "nfs-subdir-external-provisioner-root", "mountPath": "/persistentvolumes"} in c["volumeMounts"]
    sc = inst.one("storage.k8s.io/v1", "StorageClass", "nfs-client")
    assert sc["provisioner"] == env["PROVISIONER_NAME"]
    assert sc["parameters"] == {"archiveOnDelete": "false", "onDelete": "retain",
                                "pathPattern": "${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}"}
    assert sc["mountOptions"] == ["nfsvers=4.1", "hard"]
    assert sc["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    # mount options: the export is mounted through a static PV/PVC that carries them
    pv = inst.one("v1", "PersistentVolume")
    assert pv["spec"]["nfs"] == {"server": "10.0.0.20", "path": "/exports/k8s"}
    assert pv["spec"]["mountOptions"] == ["nfsvers=4.1", "hard"]
    claim = inst.one("v1", "PersistentVolumeClaim")
    volume = deploy["spec"]["template"]["spec"]["volumes"][0]
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert inst.one("policy/v1", "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert deploy["metadata"]["labels"]["team"] == "storage"


def test_nfs_without_leader_election_and_with_a_kept_provisioner_name(installs: dict[str, Install]) -> None:
    inst = installed(installs, "everything-values.yaml")
    c = container(inst.one("apps/v1", "Deployment", "lp-localpv-nfs"))
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["ENABLE_LEADER_ELECTION"] == "false"
    assert env["PROVISIONER_NAME"] == "k8s-sigs.io/nfs-subdir-external-provisioner"
    assert c["securityContext"]["runAsUser"] == 0
    volume = inst.one("apps/v1", "Deployment", "lp-localpv-nfs")["spec"]["template"]["spec"]["volumes"][0]
    assert volume["nfs"] == {"server": "nfs.example.com", "path": "/srv/nfs"}
    sc = inst.one("storage.k8s.io/v1", "StorageClass", "nfs-archive")
    assert sc["parameters"] == {"archiveOnDelete": "true"} and sc["allowVolumeExpansion"] is False


def test_service_and_service_monitor_select_the_agent(installs: dict[str, Install]) -> None:
    inst = installed(installs, "upstream-block-jobs-values.yaml")
    svc = inst.one("v1", "Service")
    ds = inst.one("apps/v1", "DaemonSet")
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] == "metrics"
    monitor = inst.one("monitoring.coreos.com/v1", "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["interval"] == "30s"
    assert installed(installs, "everything-values.yaml").one("v1", "Service")["spec"]["ports"][0]["port"] == 8080
    assert installed(installs, "defaults").server.list("v1", "Service", NAMESPACE) == []


def test_notes_say_what_to_check_next(installs: dict[str, Install]) -> None:
    notes = installed(installs, "upstream-block-jobs-values.yaml").notes
    assert f"kubectl get pv -l {NODE_LABEL_KEY}" in notes
    assert "localpv doctor" in notes and "get jobs" in notes
    nfs_notes = installed(installs, "nfs-subdir-values.yaml").notes
    assert "cluster.local/lp-localpv" in nfs_notes and "doctor" not in nfs_notes


@pytest.mark.parametrize("name", ["defaults", "upstream-block-jobs-values.yaml"])
def test_doctor_checks_exactly_the_permissions_the_chart_grants_the_agent(
        installs: dict[str, Install], name: str, tmp_path: Path) -> None:
    inst = installed(installs, name)
    config = load_config(_config_dir(inst, tmp_path)).config
    needed = {(a.verb, f"{a.group}/{a.resource}" if a.group else a.resource)
              for a in required_access(config, NAMESPACE)}
    granted = {(verb, resource) for kind in ("ClusterRole", "Role")
               for resource, verbs in _granted(inst, kind).items() for verb in verbs}
    assert needed == granted


def test_helm_lint_finds_no_warning_or_error(helm_python: Path, tmp_path: Path) -> None:
    result = lint(helm_python, tmp_path)
    assert result["TotalChartsLinted"] == 1
    # Helm's severities: 1 info (e.g. "icon is recommended"), 2 warning, 3 error
    assert [m for m in result["Messages"] or [] if m["Severity"] >= 2] == []


@pytest.mark.parametrize("name", ["defaults", "everything-values.yaml", "nfs-subdir-values.yaml"])
def test_every_container_command_line_is_accepted_by_the_cli(
        installs: dict[str, Install], name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The args the chart renders parse (durations, flags) with the command they name, and
    the environment the chart sets fills what the args leave out."""
    inst = installed(installs, name)
    workloads = inst.server.list("apps/v1", "DaemonSet", NAMESPACE) + inst.server.list("apps/v1", "Deployment",
                                                                                         NAMESPACE)
    assert workloads
    for workload in workloads:
        c = container(workload)
        with monkeypatch.context() as env:
            for var in c.get("env") or []:
                env.setenv(var["name"], var.get("value") or "from-downward-api")
            command = cli.commands[c["args"][0]]
            ctx = command.make_context(c["args"][0], list(c["args"][1:]))
            assert ctx.params, workload["metadata"]["name"]

"""Upgrade and rollback, end to end (issue 26.3): the previous release's chart and image are
installed, tenants are put on every kind of volume, ``helm upgrade`` moves the release to this
checkout's chart and image, then back to the previous release's (what ``helm rollback`` applies;
see the second test), and at every poll while the agents roll, and after:

- every tenant pod keeps running (same uid, no container restarted) and reads its data back:
  two static volumes, a dynamic volume staged under its pod (the CSI node plugin is the agent
  being replaced);
- no static PV is Available over anybody's files;
- a released volume whose cleaner process is in flight when its agent is stopped (the cleaner
  is frozen with SIGSTOP after it started, so that it is mid-work for certain) is cleaned by the
  next agent and offered again, empty;
- never two agent pods on the node, nor two agent processes on its state dir;
- the NFS provisioner's claim stays Bound to its PV, and the new provisioner provisions.

No NFS server here: the provisioner runs in ``buildMode`` (an emptyDir as its export, as in
test_nfs_component.py), so the NFS claim's files go with the provisioner pod that the upgrade
replaces: what is checked for NFS is the API side (the claim, its PV, provisioning after).

Needs, besides the suite's variables, LOCALPV_E2E_PREVIOUS_IMAGE (the previous release's image,
on the node) and LOCALPV_E2E_PREVIOUS_CHART (its chart directory); .ci/e2e builds both from the
commit it names as the previous release (LOCALPV_E2E_PREVIOUS_RELEASE, only reported here).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from localpv.kube.finalizers import EXTERNAL_PROVISIONER_FINALIZER
from localpv.kube.resources import PERSISTENT_VOLUME_CLAIMS, PERSISTENT_VOLUMES, PODS
from tests.e2e.cluster import CHART, DAEMON_SETS, Cluster, Obj, wait_for
from tests.e2e.conftest import Release
from tests.e2e.test_dynamic import DRIVER, KUBELET_DIR, bound_pv, claim, long_pod, pool_disk

PREVIOUS_IMAGE = os.environ.get("LOCALPV_E2E_PREVIOUS_IMAGE") or ""
PREVIOUS_CHART = os.environ.get("LOCALPV_E2E_PREVIOUS_CHART") or ""
PREVIOUS_RELEASE = os.environ.get("LOCALPV_E2E_PREVIOUS_RELEASE") or "(not named)"

pytestmark = [
    pytest.mark.e2e,
    # Each test moves a whole release and waits on deadlines of its own (rollouts, cleaning):
    # the suite's 300 s per test (with the module's setup in the first) is too short under load.
    pytest.mark.timeout(900),
    pytest.mark.skipif(not (PREVIOUS_IMAGE and PREVIOUS_CHART),
                       reason="e2e upgrade: set LOCALPV_E2E_PREVIOUS_IMAGE and LOCALPV_E2E_PREVIOUS_CHART "
                              "(the previous release's image and chart; .ci/e2e builds them)"),
]

#: Files a released volume holds when its cleaning starts: about 3 s of the cleaner's work, the
#: window in which the test finds the cleaner process and freezes it.
FILLER_DIRS, FILLER_FILES = 300, 1000
MiB = 1 << 20


@dataclass
class Tenant:
    """A pod that must keep running, and what it must read back."""

    name: str
    claim: str
    data: str
    uid: str = ""
    started: str = ""
    restarts: int = 0


@dataclass
class Setup:
    rel: Release
    pool: Path
    device: str
    dynamic_class: str
    nfs_class: str
    tenants: list[Tenant] = field(default_factory=list)
    nfs_pv: Obj = field(default_factory=dict)
    dyn_image: Path | None = None
    #: Cleaner processes this test froze (SIGSTOP): let go at the end, if still there.
    frozen: list[int] = field(default_factory=list)
    upgraded: bool = False


def _agent_processes(state_dir: Path) -> list[int]:
    """The node's agent processes on this state dir (their own children left out)."""
    found: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if b"agent" in argv and f"--state-dir={state_dir}".encode() in argv:
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return sorted(pid for pid, ppid in found.items() if ppid not in found)


def _cleaner_of(volume: Path) -> int | None:
    """The filesystem cleaner process working on ``volume`` (python -m localpv.host.fsclean)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"localpv.host.fsclean" in argv and str(volume).encode() in argv:
            return int(entry.name)
    return None


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _entries(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class Watch:
    """What must hold at every moment of a rollout, polled in a thread until stopped."""

    def __init__(self, cluster: Cluster, setup: Setup, interval: float = 0.3) -> None:
        self.cluster, self.setup, self.interval = cluster, setup, interval
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.polls = 0
        self.agent_pods_seen: list[str] = []
        self.agent_processes_seen: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="upgrade-watch", daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll()
            except Exception as err:  # the API may blink; the poll after says what holds
                self.errors.append(f"{type(err).__name__}: {err}")
            self._stop.wait(self.interval)

    def _violation(self, what: str) -> None:
        if what not in self.violations:
            self.violations.append(what)

    def poll(self) -> None:
        c, s = self.cluster, self.setup
        ns = s.rel.namespace
        agents = [p for p in c.list(PODS, ns, label_selector="app.kubernetes.io/component=agent")
                  if p["spec"].get("nodeName") == c.node]
        for pod in agents:
            if pod["metadata"]["name"] not in self.agent_pods_seen:
                self.agent_pods_seen.append(pod["metadata"]["name"])
        if len(agents) > 1:
            self._violation("two agent pods on the node at once: " + ", ".join(
                f"{p['metadata']['name']} ({(p.get('status') or {}).get('phase')}"
                f"{', terminating' if p['metadata'].get('deletionTimestamp') else ''})" for p in agents))
        processes = _agent_processes(s.rel.host.state)
        self.agent_processes_seen += [pid for pid in processes if pid not in self.agent_processes_seen]
        if len(processes) > 1:
            self._violation(f"two agent processes on state dir {s.rel.host.state}: pids {processes}")
        for t in s.tenants:
            pod = c.get(PODS, t.name, ns)
            if pod is None:
                self._violation(f"tenant pod {t.name} is gone")
                continue
            [status] = (pod.get("status") or {}).get("containerStatuses") or [{}]
            started = ((status.get("state") or {}).get("running") or {}).get("startedAt")
            if (pod["metadata"]["uid"], status.get("restartCount"), started) != (t.uid, t.restarts, t.started):
                self._violation(f"tenant pod {t.name} was replaced or restarted: uid {pod['metadata']['uid']}, "
                                f"restarts {status.get('restartCount')}, started {started}; "
                                f"state {status.get('state')}")
        for pv in c.list(PERSISTENT_VOLUMES):
            if pv["spec"].get("storageClassName") != s.rel.storage_class:
                continue
            if (pv.get("status") or {}).get("phase") != "Available":
                continue
            path = Path(pv["spec"]["local"]["path"])
            if left := _entries(path):
                self._violation(f"PV {pv['metadata']['name']} Available over {path}, which holds "
                                f"{len(left)} entries ({sorted(left)[:3]}...)")
        if s.dyn_image is not None and not s.dyn_image.exists():
            self._violation(f"the dynamic tenant's image {s.dyn_image} is gone")
        self.polls += 1


def _running(cluster: Cluster, namespace: str, tenant: Tenant) -> None:
    pod = cluster.get(PODS, tenant.name, namespace) or {}
    [status] = pod["status"]["containerStatuses"]
    tenant.uid, tenant.restarts = pod["metadata"]["uid"], status["restartCount"]
    tenant.started = status["state"]["running"]["startedAt"]


def _static_tenant(cluster: Cluster, rel: Release, volume: str, data: str) -> Tenant:
    ns = rel.namespace
    path = rel.host.disks / volume
    pv = cluster.available_pv(path)
    t = Tenant(f"{volume}-user", volume, data)
    cluster.claim(ns, t.claim, rel.storage_class, volume_name=pv["metadata"]["name"])
    cluster.create(PODS, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": t.name}, "spec": {
        "nodeSelector": {"kubernetes.io/hostname": cluster.hostname}, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "work", "image": cluster.image, "imagePullPolicy": "IfNotPresent",
                        "command": ["sh", "-c", f"echo {data} > /data/f; sync; sleep 36000"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": t.claim}}]}}, ns)
    wait_for(lambda: ((cluster.get(PODS, t.name, ns) or {}).get("status", {}).get("phase") == "Running"
             and (path / "f").exists()) or None, 120, f"tenant {t.name} running and its file written")
    _running(cluster, ns, t)
    return t


@pytest.fixture(scope="module")
def setup(release_factory: Callable[..., Release], cluster: Cluster) -> Iterator[Setup]:
    rel = release_factory("upg")
    for name, size in (("vol1", "16m"), ("vol2", "16m"), ("vol3", "64m"), ("vol4", "64m")):
        rel.host.mount_volume(name, size)
    pool, device = pool_disk(rel.host.root, "pool", 512 * MiB)
    nfs_class = f"{rel.storage_class}-nfs"
    s = Setup(rel, pool, device, f"{rel.storage_class}-dyn", nfs_class)
    cluster.install(rel.helm_python, rel.name, rel.namespace, values_for(s, PREVIOUS_IMAGE), chart=Path(PREVIOUS_CHART))
    try:
        yield s
    finally:
        ns = rel.namespace
        for pid in s.frozen:
            if _cleaner_of(rel.host.disks / "vol3") == pid or _cleaner_of(rel.host.disks / "vol4") == pid:
                os.kill(pid, signal.SIGCONT)
        with contextlib.suppress(AssertionError):
            cluster.delete_workload_pods(ns)
        # Rolled back, the previous agent and NFS provisioner never remove the deletion
        # protection finalizer this checkout's put on their PVs (issue 26.2c): a PV released then
        # stays Terminating for good. docs/operations.md's step, for every PV of the driver and
        # of the NFS provisioner.
        nfs_provisioner = f"e2e.localpv.dev/{s.nfs_class}"
        for pv in cluster.list(PERSISTENT_VOLUMES):
            ours = (pv["spec"].get("csi") or {}).get("driver") == DRIVER or \
                (pv["metadata"].get("annotations") or {}).get("pv.kubernetes.io/provisioned-by") == nfs_provisioner
            if ours and EXTERNAL_PROVISIONER_FINALIZER in (pv["metadata"].get("finalizers") or []):
                unprotect = {"metadata": {"$deleteFromPrimitiveList/finalizers": [EXTERNAL_PROVISIONER_FINALIZER]}}
                cluster.api.patch(PERSISTENT_VOLUMES, pv["metadata"]["name"], unprotect, patch_type="strategic")
        for pvc in cluster.list(PERSISTENT_VOLUME_CLAIMS, ns):
            cluster.delete(PERSISTENT_VOLUME_CLAIMS, pvc["metadata"]["name"], ns)

        def dynamic_or_nfs() -> list[Obj]:
            return [pv for pv in cluster.list(PERSISTENT_VOLUMES)
                    if pv["spec"].get("storageClassName") in (s.dynamic_class, s.nfs_class)]
        with contextlib.suppress(AssertionError):
            wait_for(lambda: not dynamic_or_nfs() or None, 120, "the dynamic and NFS PVs deleted by the release")
        for pv in dynamic_or_nfs():
            cluster.delete(PERSISTENT_VOLUMES, pv["metadata"]["name"])
        # release_factory then uninstalls the release and removes the rest; the pool goes first
        # only once no pod holds it, so after that: here, lazily.
        subprocess.run(["umount", "-l", str(pool)], check=False)
        subprocess.run(["losetup", "-d", device], check=False)


def values_for(s: Setup, image: str) -> Obj:
    """The same values for both releases but the image: a static class, a dynamic class, the
    NFS provisioner (buildMode: no NFS server here) in one release."""
    return s.rel.values(
        image=image,
        agent={"enabled": True, "stateDir": str(s.rel.host.state)},
        dynamic={"driverName": DRIVER, "kubeletDir": KUBELET_DIR,
                 "pools": [{"name": "upg", "hostDir": str(s.pool)}],
                 "classes": [{"name": s.dynamic_class, "pool": "upg"}]},
        buildMode=True, nfs={"server": "127.0.0.1", "path": "/export"},
        storageClass={"name": s.nfs_class, "provisionerName": f"e2e.localpv.dev/{s.nfs_class}"})


def _released_in_flight(cluster: Cluster, s: Setup, volume: str) -> int:
    """A tenant writes to ``volume``, which is then filled with files and released; its
    cleaner process is found as soon as it starts and frozen mid-work. Its pid."""
    rel, ns = s.rel, s.rel.namespace
    path = rel.host.disks / volume
    pv = cluster.available_pv(path)
    cluster.claim(ns, volume, rel.storage_class, volume_name=pv["metadata"]["name"])
    phase, log = cluster.run_pod(ns, f"{volume}-writer", volume, "echo secret > /data/secret && sync")
    assert phase == "Succeeded", log
    for d in range(FILLER_DIRS):
        (path / f"d{d}").mkdir()
        for i in range(FILLER_FILES):
            (path / f"d{d}" / f"f{i}").touch()
    cluster.delete_and_wait(PODS, f"{volume}-writer", ns)
    cluster.delete(PERSISTENT_VOLUME_CLAIMS, volume, ns)
    deadline = time.monotonic() + 90
    while (pid := _cleaner_of(path)) is None:
        assert time.monotonic() < deadline, f"no cleaner process for {path} within 90 s of its release"
        assert len(_entries(path)) > 1, f"{path} was cleaned before its cleaner process was seen"
        time.sleep(0.005)
    os.kill(pid, signal.SIGSTOP)
    s.frozen.append(pid)
    wait_for(lambda: _state(pid) in ("T", "t", "gone") or None, 10, f"cleaner {pid} stopped")
    assert _state(pid) != "gone", f"the cleaner of {path} ended before it could be frozen"
    assert _entries(path), f"{path} was emptied before its cleaner was frozen"
    assert cluster.pv_for(path) is None or (cluster.pv_for(path) or {}).get("status", {}).get("phase") != "Available"
    return pid


def _rolled_out(cluster: Cluster, s: Setup, image: str) -> None:
    """The DaemonSet rolled to ``image`` and its pod Ready; the NFS provisioner too."""
    ns = s.rel.namespace

    def done() -> bool | None:
        ds = cluster.get(DAEMON_SETS, f"{s.rel.name}-localpv", ns) or {}
        st = ds.get("status") or {}
        return (st.get("observedGeneration", 0) >= ds["metadata"]["generation"]
                and st.get("updatedNumberScheduled") == st.get("desiredNumberScheduled") == st.get("numberAvailable")
                and not st.get("numberUnavailable")) or None
    wait_for(done, 240, f"DaemonSet {s.rel.name}-localpv rolled out")
    agent = cluster.agent_pod(ns, timeout=120)
    assert agent["spec"]["containers"][0]["image"] == image

    def nfs_rolled() -> bool | None:
        pods = cluster.list(PODS, ns, label_selector="app.kubernetes.io/component=nfs")
        return (len(pods) == 1 and pods[0]["spec"]["containers"][0]["image"] == image
                and any(c["type"] == "Ready" and c["status"] == "True"
                        for c in (pods[0].get("status") or {}).get("conditions") or [])) or None
    wait_for(nfs_rolled, 180, f"the NFS provisioner running {image}, Ready, alone")


def _everything_kept(cluster: Cluster, s: Setup, in_flight: Path, cleaner: int, watch: Watch, what: str) -> None:
    ns = s.rel.namespace
    assert not watch.violations, f"{what}: " + "; ".join(watch.violations)
    assert watch.polls > 10, f"{what}: only {watch.polls} polls during the rollout ({watch.errors[-3:]})"
    assert len(watch.agent_pods_seen) >= 2, f"{what}: the agent pod was not replaced: {watch.agent_pods_seen}"
    assert len(watch.agent_processes_seen) >= 2, f"{what}: agent processes seen: {watch.agent_processes_seen}"
    for t in s.tenants:
        script = f"cat /data/f && echo {what} >> /data/log && sync && cat /data/log"
        out = cluster.exec(t.name, ns, ["sh", "-c", script])
        assert out.split()[0] == t.data, f"{what}: tenant {t.name} reads {out!r}, wrote {t.data}"
        assert what in out.split()[1:], out
    # the frozen cleaner went with its agent; the next agent cleaned the volume and offers it empty
    wait_for(lambda: _state(cleaner) == "gone" or None, 60, f"{what}: the frozen cleaner {cleaner} gone")
    pv = cluster.available_pv(in_flight, timeout=240)
    assert _entries(in_flight) == [], f"{what}: {in_flight} offered as PV {pv['metadata']['name']} but not empty"
    # the NFS claim is still bound to its PV, and the provisioner provisions
    pvc = cluster.get(PERSISTENT_VOLUME_CLAIMS, "nfs-claim", ns) or {}
    assert (pvc.get("status") or {}).get("phase") == "Bound"
    nfs_pv = cluster.get(PERSISTENT_VOLUMES, pvc["spec"]["volumeName"]) or {}
    assert nfs_pv.get("metadata", {}).get("uid") == s.nfs_pv["metadata"]["uid"]
    assert (nfs_pv.get("status") or {}).get("phase") == "Bound"
    cluster.claim(ns, f"nfs-{what}", s.nfs_class)
    wait_for(lambda: ((cluster.get(PERSISTENT_VOLUME_CLAIMS, f"nfs-{what}", ns) or {}).get("status") or {})
             .get("phase") == "Bound" or None, 90, f"{what}: a new NFS claim provisioned")
    # the dynamic volume's image is where it was, staged
    dyn = bound_pv(cluster, ns, "dyn")
    staging = Path(KUBELET_DIR) / "plugins" / "kubernetes.io" / "csi" / "pv" / dyn["metadata"]["name"] / "globalmount"
    assert os.path.ismount(staging), f"{what}: {staging} is no longer mounted"


def test_upgrade_from_the_previous_release_keeps_every_tenant(cluster: Cluster, setup: Setup) -> None:
    s, ns = setup, setup.rel.namespace
    previous = cluster.agent_pod(ns, timeout=180)
    assert previous["spec"]["containers"][0]["image"] == PREVIOUS_IMAGE, PREVIOUS_RELEASE
    cluster.ready_pods(ns, "nfs")
    s.tenants.append(_static_tenant(cluster, s.rel, "vol1", "first"))
    s.tenants.append(_static_tenant(cluster, s.rel, "vol2", "second"))
    claim(cluster, ns, "dyn", s.dynamic_class, "64Mi")
    dyn = Tenant("dyn-user", "dyn", "third")
    long_pod(cluster, ns, dyn.name, dyn.claim, f"echo {dyn.data} > /data/f; sync; sleep 36000")
    wait_for(lambda: "third" in cluster.exec(dyn.name, ns, ["cat", "/data/f"]) or None, 30, "the dynamic tenant's file")
    _running(cluster, ns, dyn)
    s.tenants.append(dyn)
    dyn_pv = bound_pv(cluster, ns, "dyn")
    s.dyn_image = s.pool / dyn_pv["metadata"]["name"] / "disk.img"
    assert s.dyn_image.exists()
    cluster.claim(ns, "nfs-claim", s.nfs_class)
    wait_for(lambda: ((cluster.get(PERSISTENT_VOLUME_CLAIMS, "nfs-claim", ns) or {}).get("status") or {})
             .get("phase") == "Bound" or None, 90, "the NFS claim Bound")
    s.nfs_pv = bound_pv(cluster, ns, "nfs-claim")
    cleaner = _released_in_flight(cluster, s, "vol3")

    with Watch(cluster, s) as watch:
        cluster.upgrade(s.rel.helm_python, s.rel.name, ns, values_for(s, cluster.image), chart=CHART)
        _rolled_out(cluster, s, cluster.image)
        _everything_kept(cluster, s, s.rel.host.disks / "vol3", cleaner, watch, "upgraded")
    s.upgraded = True


def test_rollback_to_the_previous_release_keeps_every_tenant(cluster: Cluster, setup: Setup) -> None:
    s, ns = setup, setup.rel.namespace
    if not s.upgraded:
        pytest.skip("the upgrade failed: nothing to roll back")
    cleaner = _released_in_flight(cluster, s, "vol4")
    with Watch(cluster, s) as watch:
        # What `helm rollback` applies: the previous revision's chart and values. Through an
        # upgrade, since helm-sdkpy 0.1.32's Rollback fails before it starts ("unable to get
        # waiter: wait strategy not set": Helm 4's rollback action needs one; helm/helm#31337).
        cluster.upgrade(s.rel.helm_python, s.rel.name, ns, values_for(s, PREVIOUS_IMAGE), chart=Path(PREVIOUS_CHART))
        _rolled_out(cluster, s, PREVIOUS_IMAGE)
        _everything_kept(cluster, s, s.rel.host.disks / "vol4", cleaner, watch, "rolledback")

"""Dynamic volumes in the node agent: the one hook the agent calls (``start_dynamic``).

It is imported only when the ConfigMap has a ``dynamicClassMap``, so an agent with static
classes only never loads grpcio. It wires: the image journal (``<state dir>/csi-images.json``),
the pools of the current configuration, the CSI socket (Identity + Node) and the
registration socket under the kubelet's directory, and the provisioning controller with its
events and metrics on the agent's registry.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry

from localpv.clock import Clock
from localpv.config import ProvisionerConfig
from localpv.config.dynamic import PoolConfig
from localpv.csi import provisioner as rules
from localpv.csi.capacity import Room
from localpv.csi.controller import DynamicController, DynamicSettings
from localpv.csi.health import PoolRisk
from localpv.csi.identity import IdentityService
from localpv.csi.images import ImageError, ImageStore
from localpv.csi.journal import ImageJournal, ImageJournalError, ImageState
from localpv.csi.metrics import DynamicMetrics, PoolFigures
from localpv.csi.node import SERVER_THREADS, NodeService
from localpv.csi.pools import Pool, PoolState, move_refusal
from localpv.csi.publisher import CapacityPublisher, CapacitySettings
from localpv.csi.registration import RegistrationService, SocketPaths
from localpv.csi.rpc import SocketInUse, UnixServer
from localpv.csi.watch import HealthWatch
from localpv.kube.api import KubeApi
from localpv.kube.events import EventRecorder
from localpv.kube.objects import Obj
from localpv.kube.resources import NODES
from localpv.naming import HOSTNAME_LABEL_KEY

log = logging.getLogger(__name__)

JOURNAL_FILE = "csi-images.json"


class DynamicVolumes:
    """The CSI servers and the controller of one node; ``problems`` feeds ``/healthz``."""

    def __init__(self, api: KubeApi, *, node_name: str, config: Callable[[], ProvisionerConfig], state_dir: str,
                 kubelet_dir: str, registry: CollectorRegistry | None = None,
                 volume_health_period: float = 60.0, namespace: str = "default",
                 capacity: CapacitySettings | None = None, capacity_clock: Clock | None = None) -> None:
        self.config = config
        self._pools: dict[object, Pool] = {}
        self.journal = ImageJournal(os.path.join(state_dir, JOURNAL_FILE))
        self.metrics = DynamicMetrics(registry)
        self.metrics.watch_pools(self.pool_figures)
        self.metrics.watch_pool_risks(lambda: {name: r.unbacked for name, r in self.pool_risks().items()})
        driver = config().csi_driver_name
        node = api.get(NODES, node_name)
        hostname = str((node["metadata"].get("labels") or {}).get(HOSTNAME_LABEL_KEY) or node_name)
        self.recorder = EventRecorder(api.for_events(), component=f"{driver}_{node_name}")
        self.controller = DynamicController(api, DynamicSettings(node_name, hostname), config=config,
                                            pools=self.pools, journal=self.journal, recorder=self.recorder,
                                            metrics=self.metrics)
        #: None when capacity tracking is off (the chart's ``dynamic.storageCapacity: false``).
        self.capacity = None if capacity is None else CapacityPublisher(
            api, node_name=node_name, namespace=namespace, config=config, rooms=self.rooms, settings=capacity,
            clock=capacity_clock, on_failure=self.metrics.capacity_failures.inc)
        if self.capacity is not None:
            publisher = self.capacity
            self.journal.listeners.append(publisher.poke)
            self.metrics.watch_capacity(publisher.published, lambda: publisher.served)
        self.paths = SocketPaths(kubelet_dir, driver)
        self.node = NodeService(node_name, self.pools, on_expanded=self.controller.expander.filesystem_grown,
                                recorded_mode=self._recorded_mode)
        self.watch = HealthWatch(node=lambda: node, pvs=self._volumes, pools=self.pools, staged=self.node.staged,
                                 risks=self.pool_risks, recorder=self.recorder, period=volume_health_period)
        self.node.on_change = self.watch.poke
        self.identity = IdentityService(driver, ready=self.controller.synced.is_set)
        self.registration = RegistrationService(driver, self.paths.csi)
        observe = self.metrics.observe_call
        self.csi_server = UnixServer(self.paths.csi, [self.identity.handler(observe), self.node.handler(observe)],
                                     workers=SERVER_THREADS)
        self.registration_server = UnixServer(self.paths.registration, [self.registration.handler(observe)])

    def _recorded_mode(self, volume: str) -> str | None:
        record = self.journal.get(volume)
        return record.volume_mode if record is not None else None

    def pools(self) -> Mapping[str, Pool]:
        """The pools of this node's configuration in use (a reloaded ConfigMap, or new labels on
        the Node that select other ``nodes`` overrides, apply at once). A pool whose images were
        made at another directory than the one configured now is refused (:func:`move_refusal`)."""
        wanted = self.config().dynamic_pools
        result = {}
        for name, pool_config in wanted.items():
            refusal = self._move_refusal(pool_config)
            pool = self._pools.get((pool_config, refusal))
            if pool is None:
                pool = self._pools[(pool_config, refusal)] = Pool(pool_config, refusal)
            result[name] = pool
        return result

    def _move_refusal(self, config: PoolConfig) -> str:
        """Why the pool may not be used at its configured directory; records the directory
        when it may (the first time, or once its images are all there)."""
        recorded = self.journal.pool_dir(config.name)
        if recorded == config.host_dir:
            return ""
        volumes = [r.volume for r in self.journal.snapshot().values()
                   if r.pool == config.name and r.state is not ImageState.CREATING]
        if recorded is not None and volumes:
            store = ImageStore(config.mount_dir)
            present = [v for v in volumes if self._is_there(store, v)]
            if refusal := move_refusal(config.name, recorded, config.host_dir, volumes, present):
                return refusal
            log.warning("pool %s: every image recorded at %s is at %s now: the record follows them", config.name,
                        recorded, config.host_dir)
        self.journal.set_pool_dir(config.name, config.host_dir)
        return ""

    def _is_there(self, store: ImageStore, volume: str) -> bool:
        """The recorded image is at this store: by name, and by identity where it has one (a
        name is only where the volume was; the UUID written into it is what it is)."""
        record = self.journal.get(volume)
        try:
            if not store.exists(volume):
                return False
            if record is None:
                return True
            if record.block:
                return not record.image_uuid or store.block_uuid(volume) == record.image_uuid
            return not record.fs_uuid or store.fs_uuid(volume) == record.fs_uuid
        except (ImageError, OSError):
            return False

    def _volumes(self) -> list[Obj]:
        """This node's dynamic PVs (the controller's cache is filtered by the node label)."""
        driver = self.config().csi_driver_name
        return [pv for pv in self.controller.pvs.list() if rules.is_ours(pv, driver)]

    def conditions(self) -> dict[tuple[str, str], float]:
        """``localpv_volume_condition`` samples of dynamic volumes."""
        return self.watch.reporter.gauge()

    def status(self) -> dict[str, object]:
        """``localpv status``'s dynamic part: every image recorded, its health, and each pool."""
        staged = self.node.staged()
        pvs = {str(pv["metadata"]["name"]): pv for pv in self._volumes()}
        images = []
        for name, record in sorted(self.journal.snapshot().items()):
            pv = pvs.get(name) or {}
            images.append({
                "volume": name, "pool": record.pool, "size": record.size, "provisioning": record.provisioning,
                "state": record.state.value, "claim": record.claim,
                "phase": (pv.get("status") or {}).get("phase", "(no PV)" if not pv else ""),
                "staged": staged.get(name, ""), "health": self.watch.reporter.of(name)})
        risks = self.pool_risks()
        pools = [{"pool": name, "state": self.pools()[name].state()[0].value, "capacity": f.capacity, "free": f.free,
                  "promised": f.committed, "unwritten": f.unwritten, "images": f.images,
                  "risk": risks[name].sentence() if name in risks else ""}
                 for name, f in sorted(self.pool_figures().items())]
        published = self.capacity.published() if self.capacity is not None else {}
        return {"images": images, "pools": pools, "capacity": [
            {"storageclass": name, "capacity": value} for name, value in sorted(published.items())]}

    def rooms(self) -> dict[str, Room | None]:
        """What each pool of this node's configuration can take now, thin and thick (None: the
        pool is not usable now). Raises OSError when an account cannot be read (an image being
        made or removed): the capacity publisher tries again at its next pass."""
        found: dict[str, Room | None] = {}
        for name, pool in self.pools().items():
            if pool.state()[0] is not PoolState.READY:
                found[name] = None
                continue
            account = self.controller.ledger.account(pool)
            found[name] = Room(account.largest(thick=False), account.largest(thick=True))
        return found

    def pool_risks(self) -> dict[str, PoolRisk]:
        """Pools at risk: what their thin images may still write exceeds their free space (less
        ``reserved``), and the filesystem is fuller than the pool's high-water mark.

        Free space here is what the loop devices' writes can take: the filesystem's free blocks
        including those ext4 keeps for root (the loop device writes from a kernel thread). An
        over-committed pool has promises it cannot back by design; it is said to be at risk only
        once it fills up past the mark - before the first write fails, not at the first claim.
        """
        risks = {}
        for name, pool in self.pools().items():
            if pool.state()[0] is not PoolState.READY:
                continue
            try:
                account = self.controller.ledger.account(pool)
                st = os.statvfs(pool.config.mount_dir)
            except OSError:
                continue
            free = st.f_bfree * st.f_frsize
            room = max(0, free - account.terms.reserved)
            used = 1 - free / (st.f_blocks * st.f_frsize or 1)
            if account.unwritten > room and used >= pool.config.high_water:
                risks[name] = PoolRisk(name, free, account.unwritten, account.unwritten - room)
        return risks

    def pool_figures(self) -> dict[str, PoolFigures]:
        """Each pool's figures, from its filesystem's account (pools on one filesystem show the same)."""
        figures = {}
        records = self.journal.snapshot().values()
        for name, pool in self.pools().items():
            images = sum(1 for r in records if r.pool == name)
            if pool.state()[0] is not PoolState.READY:
                figures[name] = PoolFigures(0, 0, sum(r.size for r in records if r.pool == name), 0, images)
                continue
            try:
                account = self.controller.ledger.account(pool)
            except OSError:
                continue  # an image being made or removed, a pool going: counted next scrape
            figures[name] = PoolFigures(account.space.capacity, account.space.free, account.promised,
                                        account.allocated, images, account.unwritten)
        return figures

    def start(self) -> None:
        self.recorder.start()
        self.controller.start()
        self.controller.supervisor.spawn("csi-health", self.watch.run)
        if self.capacity is not None:
            self.controller.supervisor.spawn("csi-capacity", self.capacity.run)
        self.csi_server.start()
        # Registration last: the kubelet calls NodeGetInfo on the CSI socket as soon as it sees it.
        self.registration_server.start()
        log.info("dynamic volumes: driver %s, CSI socket %s, registration socket %s", self.paths.driver,
                 self.paths.csi, self.paths.registration)

    def stop(self) -> None:
        if self.capacity is not None:
            self.capacity.stop()
        self.watch.stop()
        self.registration_server.stop()
        self.csi_server.stop()
        self.controller.stop()
        self.recorder.flush(2)
        self.recorder.stop()

    def problems(self) -> list[str]:
        found = self.controller.problems() + self.watch.problems()
        found += [f"{s.path} is not served" for s in (self.csi_server, self.registration_server) if not s.serving]
        refused = self.registration.problem()
        return found + ([refused] if refused else [])


class DynamicStartError(Exception):
    """Dynamic volumes cannot be served on this node (the message says why and what to do)."""


def start_dynamic(api: KubeApi, *, node_name: str, config: Callable[[], ProvisionerConfig], state_dir: str,
                  kubelet_dir: str, registry: CollectorRegistry, volume_health_period: float = 60.0,
                  namespace: str = "default", capacity_tracking: bool = True) -> DynamicVolumes:
    """The agent's hook: build and start everything dynamic volumes need on this node."""
    try:
        dynamic = DynamicVolumes(api, node_name=node_name, config=config, state_dir=state_dir,
                                 kubelet_dir=kubelet_dir, registry=registry, volume_health_period=volume_health_period,
                                 namespace=namespace, capacity=CapacitySettings() if capacity_tracking else None)
        dynamic.start()
    except (ImageJournalError, SocketInUse) as err:
        raise DynamicStartError(str(err)) from err
    except OSError as err:
        raise DynamicStartError(f"dynamic volumes cannot start: {err} (is {kubelet_dir} the kubelet's root "
                                "directory, mounted into the agent?)") from err
    return dynamic

"""Real pools (ext4 on loop devices, mounted), real images, a real gRPC server on a unix
socket and a real gRPC client: what the kubelet would do, without a kubelet."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf.message import Message

from localpv.config.dynamic import PoolConfig
from localpv.csi.identity import IdentityService
from localpv.csi.images import FsType, Provisioning
from localpv.csi.node import SERVER_THREADS, NodeService
from localpv.csi.pools import Pool
from localpv.csi.proto import csi_pb2 as csi
from localpv.csi.rpc import UnixServer, unary_call
from localpv.csi.volume import FS_UUID, NODE, POOL
from tests.support.hostfs import LoopDevices, MiB, Mounter

NODE_NAME = "node-1"


@dataclass
class PoolEnv:
    """A pool on a real mounted ext4 filesystem."""

    root: Path
    pool: Pool

    def image(self, name: str, size: int = 32 * MiB, fs: FsType = FsType.EXT4,
              provisioning: Provisioning = Provisioning.THIN) -> dict[str, str]:
        """Make an image as the controller would; returns its PV's volumeAttributes."""
        fs_uuid = self.pool.images.create(name, size, fs=fs, provisioning=provisioning)
        return {POOL: self.pool.name, FS_UUID: fs_uuid, NODE: NODE_NAME}


@pytest.fixture
def pool_env(tmp_path: Path, loops: LoopDevices, mounter: Mounter) -> PoolEnv:
    device = loops.attach(512 * MiB, ext4=True)
    root = mounter.device(device.path, tmp_path / "pool")
    return PoolEnv(root, Pool(PoolConfig(name="fast", host_dir=str(root), mount_dir=str(root))))


class Client:
    """A real gRPC client on the plugin's socket."""

    def __init__(self, path: str) -> None:
        self.channel = grpc.insecure_channel(f"unix://{path}")

    def call(self, method: str, request: Message, response: type[Message]) -> Message:
        return unary_call(self.channel, method, request, response)

    def node(self, method: str, request: Message) -> Message:
        answers = {
            "NodeStageVolume": csi.NodeStageVolumeResponse, "NodeUnstageVolume": csi.NodeUnstageVolumeResponse,
            "NodePublishVolume": csi.NodePublishVolumeResponse,
            "NodeUnpublishVolume": csi.NodeUnpublishVolumeResponse,
            "NodeGetVolumeStats": csi.NodeGetVolumeStatsResponse, "NodeExpandVolume": csi.NodeExpandVolumeResponse,
            "NodeGetCapabilities": csi.NodeGetCapabilitiesResponse, "NodeGetInfo": csi.NodeGetInfoResponse,
        }
        return self.call(f"/csi.v1.Node/{method}", request, answers[method])

    def close(self) -> None:
        self.channel.close()


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for sockets (sun_path holds 108 bytes; pytest's tmp_path may be longer)."""
    path = Path(tempfile.mkdtemp(prefix="lpv-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def serve(socket_dir: Path) -> Iterator[Callable[..., Client]]:
    """Serve handlers on a unix socket; yields a client factory."""
    tmp_path = socket_dir
    servers: list[UnixServer] = []
    clients: list[Client] = []

    def start(*handlers: grpc.GenericRpcHandler, name: str = "csi.sock", workers: int = SERVER_THREADS) -> Client:
        server = UnixServer(str(tmp_path / name), list(handlers), workers=workers)
        server.start()
        servers.append(server)
        client = Client(server.path)
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.close()
    for server in servers:
        server.stop()


@pytest.fixture
def plugin(pool_env: PoolEnv, serve: Callable[..., Client]) -> tuple[Client, NodeService]:
    node = NodeService(NODE_NAME, lambda: {pool_env.pool.name: pool_env.pool})
    return serve(node.handler(), IdentityService("local.csi.localpv.dev").handler()), node


def capability(fs: str = "ext4", mode: int = csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER,
               flags: tuple[str, ...] = ()) -> csi.VolumeCapability:
    return csi.VolumeCapability(mount=csi.VolumeCapability.MountVolume(fs_type=fs, mount_flags=list(flags)),
                                access_mode=csi.VolumeCapability.AccessMode(mode=mode))

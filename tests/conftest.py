"""Shared test helpers: root detection and waiting on conditions (never sleeping)."""

from __future__ import annotations

import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import pytest

from tests.support.hostfs import (
    HungFuse,
    LoopDevice,
    LoopDevices,
    Mounter,
    fuse_unavailable,
    loops_backed_by,
    mounts_under,
    sh,
    umount,
)

if TYPE_CHECKING:
    from localpv.kube.api import KubeApi
    from localpv_emulator.apiserver import ApiServer

T = TypeVar("T")

IS_ROOT = os.geteuid() == 0

# ---------------------------------------------------------------- system tools

#: The programs tests run that a minimal Debian lacks, each with the Debian package that has it
#: (.ci/run installs them; the README's first lines name them).
SYSTEM_TOOLS: dict[str, str] = {
    "mkfs.xfs": "xfsprogs",
    "xfs_growfs": "xfsprogs",
    "sfdisk": "fdisk",
    "shellcheck": "shellcheck",
    "promtool": "prometheus",
    "prometheus": "prometheus",
    "kubectl": "kubernetes-client",
}
#: Set to 1 (.ci/run does) to make a missing tool fail its tests instead of skipping them: CI
#: installs every tool, so a skip there would hide tests that never ran.
REQUIRE_TOOLS_ENV = "LOCALPV_REQUIRE_TOOLS"


def missing_tools(*names: str) -> str | None:
    """One line naming the tools of ``names`` not on PATH and their Debian packages, or None."""
    for name in names:
        if name not in SYSTEM_TOOLS:
            raise ValueError(f"{name}: not in tests.conftest.SYSTEM_TOOLS (add it with its Debian package)")
    missing = [n for n in names if shutil.which(n) is None]
    if not missing:
        return None
    packages = sorted({SYSTEM_TOOLS[n] for n in missing})
    return (f"{', '.join(missing)} not installed (Debian: apt-get install {' '.join(packages)}; "
            f"{REQUIRE_TOOLS_ENV}=1 makes this a failure)")


def require_tools(*names: str) -> None:
    """Skip the calling test, in one line naming each missing tool and its Debian package, unless
    every tool of ``names`` is installed; with LOCALPV_REQUIRE_TOOLS=1 fail it instead."""
    why = missing_tools(*names)
    if why is None:
        return
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(why, pytrace=False)
    pytest.skip(why)


def needs_tools(*names: str) -> pytest.MarkDecorator:
    """The mark of a test (or of one parameter set, with ``pytest.param(..., marks=...)``) that runs
    these programs: it is skipped or failed before it starts, as :func:`require_tools` says."""
    return pytest.mark.tools(*names)


#: The programs an XFS volume needs (made, grown): the mark of XFS parameters.
NEEDS_XFS = needs_tools("mkfs.xfs", "xfs_growfs")


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("tools"):
        require_tools(*mark.args)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if IS_ROOT:
        return
    skip = pytest.mark.skip(reason="needs root (real mounts and loop devices)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """GET a URL; (status, body), with HTTP errors as their status and no answer as (0, "")."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError:
        return 0, ""


def wait_for(predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")
        threading.Event().wait(interval)  # poll interval, not synchronisation


@pytest.fixture
def apiserver() -> Iterator[ApiServer]:
    """A fresh API-server emulator (binder on) on a loopback port."""
    from localpv_emulator.apiserver import ApiServer

    srv = ApiServer(binder=True)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def kube(apiserver: ApiServer) -> KubeApi:
    """The product's API seam, pointed at the emulator, with fast retries."""
    from localpv.kube.api import KubeApi
    from localpv.kube.errors import Backoff
    from localpv.kube.transport import connect

    return KubeApi(connect(apiserver.url), backoff=Backoff(initial=0.01, maximum=0.2, attempts=5))


# ---------------------------------------------------------------- real mounts and loop devices

@pytest.fixture(autouse=True)
def _no_leaks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Fail a test that leaves a mount or loop device under the test temp dir behind (and clean it)."""
    if os.geteuid() != 0:
        yield
        return
    base = str(tmp_path_factory.getbasetemp())
    yield
    mounts, loops = mounts_under(base), loops_backed_by(base)
    for target in sorted(mounts, key=len, reverse=True):
        umount(target)
    for dev in loops:
        sh("losetup", "-d", dev)
    if mounts or loops:
        pytest.fail(f"test leaked mounts {sorted(mounts)} / loop devices {sorted(loops)}")


@pytest.fixture
def mounter() -> Iterator[Mounter]:
    m = Mounter()
    try:
        yield m
    finally:
        m.umount_all()


@pytest.fixture
def tmpfs(tmp_path: Path, mounter: Mounter) -> Path:
    """An 8 MiB tmpfs mounted on a fresh directory."""
    return mounter.tmpfs(tmp_path / "tmpfs")


@pytest.fixture
def loops(tmp_path: Path) -> Iterator[LoopDevices]:
    devices = LoopDevices(tmp_path)
    try:
        yield devices
    finally:
        devices.detach_all()


@pytest.fixture
def loop_device(loops: LoopDevices) -> LoopDevice:
    """An 8 MiB loop device with no filesystem."""
    return loops.attach()


@pytest.fixture
def ext4_loop(loops: LoopDevices) -> LoopDevice:
    """An 8 MiB loop device formatted ext4."""
    return loops.attach(ext4=True)


@pytest.fixture
def hung_fuse() -> Iterator[HungFuse]:
    """Makes FUSE mounts that never answer (a wedged FUSE daemon); all aborted and unmounted at teardown."""
    why = fuse_unavailable()
    if why is not None:
        pytest.skip(why)
    mounts = HungFuse()
    try:
        yield mounts
    finally:
        mounts.release_all()

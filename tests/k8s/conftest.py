"""Fixtures for the device plugin: a real arbiterd on simulated GPUs, the fake kubelet, the plugin in-process.

One arbiterd per GPU layout serves every test of this directory (:class:`DaemonPool`); between tests its
allocations and instances are removed through the admin API, and a test that stopped it, restarted it with
other GPUs or let it forget its state gets it back as it was. Every request the plugin sends the admin API is
recorded (:class:`AdminLog`), and a test can slip a change in just before the plugin's next create.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cgpu_device_plugin import admin
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.k8s import Node, node_daemon


class DaemonPool:
    """One started arbiterd per GPU layout (``--sim-gpus``), lent to one test at a time."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.daemons: dict[str, tuple[DaemonProc, list[str]]] = {}  # layout -> (daemon, its flags)

    def lend(self, gpus: str) -> DaemonProc:
        if gpus not in self.daemons:
            d = node_daemon(self.root / f"d{len(self.daemons)}", gpus)
            self.daemons[gpus] = (d.start(), list(d.args))
        return self.daemons[gpus][0]

    def give_back(self, d: DaemonProc) -> None:
        """As it was lent: running with its own flags, with no allocation and no provisioned instance."""
        (flags,) = [f for daemon, f in self.daemons.values() if daemon is d]
        if not d.running() or d.args != flags:
            d.restart(*flags, forget=True)
        else:
            d.clear()
        doc = d.status()
        assert not doc["allocations"] and not any(g["instances"] for g in doc["gpus"]), "arbiterd kept state"

    def close(self) -> None:
        for d, _ in self.daemons.values():
            if d.running():
                d.stop()
        shutil.rmtree(self.root, ignore_errors=True)


class AdminLog:
    """Every request the plugin sends arbiterd's admin API, as (method, path, body); ``before_create``, if set,
    runs once just before the plugin's next ``alloc_ctl create`` goes out (a racing change)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str]] = []
        self.before_create: Callable[[], None] | None = None

    def wrap(self, real: Callable[..., str]) -> Callable[..., str]:
        def request(client: admin.AdminClient, method: str, path: str, body: str | None = None) -> str:
            if body is not None and body.startswith("create ") and self.before_create is not None:
                hook, self.before_create = self.before_create, None
                hook()
            self.requests.append((method, path, body or ""))
            return real(client, method, path, body)

        return request

    def creates(self) -> dict[str, str]:
        """The token digest of each allocation the plugin created, by id (the last create of an id wins)."""
        out = {}
        for method, _, body in self.requests:
            if method == "PUT" and body.startswith("create "):
                words = body.split()
                out[words[1]] = dict(w.split("=", 1) for w in words[2:])["token"]
        return out


class RecordedNode(Node):
    """A :class:`Node` on a lent daemon, with the log of what its plugins asked the admin API."""

    def __init__(self, root: Path, daemon: DaemonProc, log: AdminLog) -> None:
        super().__init__(root, daemon)
        self.log = log


@pytest.fixture(scope="package")
def daemons() -> Iterator[DaemonPool]:
    pool = DaemonPool(Path(tempfile.mkdtemp(prefix="kd-", dir="/tmp")))  # short: UNIX socket paths
    yield pool
    pool.close()


@pytest.fixture
def admin_log(monkeypatch: pytest.MonkeyPatch) -> AdminLog:
    log = AdminLog()
    monkeypatch.setattr(admin.AdminClient, "request", log.wrap(admin.AdminClient.request))
    return log


@pytest.fixture
def node_factory(daemons: DaemonPool, admin_log: AdminLog) -> Iterator[Any]:
    made: list[RecordedNode] = []

    def make(gpus_gib: list[int] | None = None) -> RecordedNode:
        gib = gpus_gib or [16, 16]
        gpus = f"{len(gib)}x{gib[0]}GiB" if len(set(gib)) == 1 else ",".join(f"{g}GiB" for g in gib)
        # short: UNIX socket paths (the rootfs' arbiter.sock included) must stay under 108 bytes
        n = RecordedNode(Path(tempfile.mkdtemp(prefix="k8-", dir="/tmp")), daemons.lend(gpus), admin_log)
        made.append(n)
        return n

    yield make
    for n in made:
        n.close()
        daemons.give_back(n.daemon)
        shutil.rmtree(n.root, ignore_errors=True)


@pytest.fixture
def node(node_factory: Any) -> RecordedNode:
    """Two 16 GiB GPUs, a fake kubelet, and no plugin started yet."""
    return node_factory()  # type: ignore[no-any-return]

"""Who may use admin.sock (arbiterd/server/admin.py): the host, and arbiterd's own pod, never another container."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from arbiterd.core.errors import IdentityError
from arbiterd.server.admin import Admin, peer_refusal
from arbiterd.server.identity import Peer

CONTAINER = "c0ffee" * 10 + "abcd"


@dataclass
class Resolver:
    """Answers every peer as ``peer``, or refuses it."""

    peer_is: Peer | None

    def peer(self, pid: int, uid: int, pidfd: int | None = None) -> Peer:
        if self.peer_is is None:
            raise IdentityError(f"pid {pid} exited (or its PID was reused) before its cgroup could be read")
        return self.peer_is


def refusal(peer: Peer | None, own_pod: str | None) -> str | None:
    admin = Admin(None, None, CollectorRegistry(), Resolver(peer), own_pod)  # type: ignore[arg-type]
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        return peer_refusal(admin, a)


def test_the_host_and_the_daemons_own_pod_may_other_containers_may_not() -> None:
    assert refusal(Peer(10, 0), None) is None
    assert refusal(Peer(10, 0, CONTAINER, "pod-a"), "pod-a") is None  # a plugin beside arbiterd in its DaemonSet
    why = refusal(Peer(10, 0, CONTAINER, "pod-b"), "pod-a")
    assert why is not None and why.startswith("pid ") and f"container {CONTAINER[:12]}" in why
    assert refusal(Peer(10, 0, CONTAINER, None), None) is not None  # arbiterd on the host: every container
    assert refusal(Peer(10, 0, CONTAINER, "pod-a"), None) is not None
    why = refusal(None, None)
    assert why is not None and why.startswith("who the peer is cannot be told")

"""The admin API: the settings tree as plain text, a JSON status document, /metrics.

    GET  /v1/tree/PATH     a file's value, or a folder's listing
    PUT  /v1/tree/PATH     set a file (the body is the value)
    GET  /v1/status        JSON status (cgpu-smi reads it)
    GET  /metrics          Prometheus text format

``metrics_listen`` serves :func:`make_metrics_app` apart: ``GET /metrics`` alone, with
no token (what a Prometheus in the cluster scrapes, as it scrapes dcgm-exporter), its
connections capped and timed as the loopback listener's are; every other path is 404.

Refusals answer 4xx with a one-line ``text/plain`` reason and change nothing;
the status comes from the error's type (400 bad value, 403 read-only, 404
unknown path, 409 conflict), and 507 means the state could not be saved. On
loopback TCP every request needs ``Authorization: Bearer <token>``.

On ``admin.sock``, a process in a container is refused (403) unless it is in
arbiterd's own pod (the plugins the DaemonSet runs beside it): the plugins
mount the socket directory into every container they set up, and a tenant
running as root could otherwise open ``admin.sock`` (mode 0600, root) and
re-provision its neighbours. Who the peer is comes from the kernel
(``SO_PEERCRED`` and its cgroup in the host's ``/proc``, read as for clients:
identity.py, whatever ``identity`` and ``proc_root`` say of clients), once,
when it connects (adminconn.py); a peer that cannot be told, or is no longer
live, is refused too. adminconn.py also caps the connections and closes silent
ones.
"""

from __future__ import annotations

import hmac
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from arbiterd.core.errors import CoreError, IdentityError
from arbiterd.server.adminconn import AdminConnections
from arbiterd.server.connection import peer_credentials
from arbiterd.server.hub import Hub
from arbiterd.server.identity import IdentityResolver, peer_pidfd
from arbiterd.server.metrics import ArbiterCollector

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Admin:
    """What the admin handlers work on."""

    hub: Hub
    token: str | None
    registry: CollectorRegistry
    peers: IdentityResolver  # who an admin.sock peer is: from the host's /proc, always by its cgroup
    own_pod: str | None = None  # arbiterd's own pod, where it runs in one: its containers may administer it
    conns: AdminConnections | None = None  # the live connections, each admin.sock peer told at accept


def own_pod(peers: IdentityResolver) -> str | None:
    """The pod arbiterd itself runs in (None on the host, or when its own cgroup cannot be read)."""
    try:
        return peers.peer(os.getpid(), os.getuid()).pod
    except IdentityError:
        return None


def peer_refusal(admin: Admin, sock: socket.socket) -> str | None:
    """Why the peer of ``sock`` (on admin.sock) may not use the admin API, or None if it may."""
    pid, uid, _ = peer_credentials(sock)
    try:
        peer = admin.peers.peer(pid, uid, peer_pidfd(sock))
    except IdentityError as exc:
        return f"who the peer is cannot be told: {exc}"
    if peer.container is None or (admin.own_pod is not None and peer.pod == admin.own_pod):
        return None
    return (f"pid {pid} is in container {peer.container[:12]}: the admin API serves the host and arbiterd's own "
            f"pod only")


ADMIN = web.AppKey("admin", Admin)


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/plain")


def _refusal(exc: CoreError) -> web.Response:
    reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return _text(reason + "\n", exc.http_status)


@web.middleware
async def admin_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    """admin.sock: the peer as the kernel told it at accept (no container but arbiterd's own pod); TCP: the bearer
    token. Each answer gives the connection admin_request_timeout_s again (adminconn.py)."""
    admin = request.app[ADMIN]
    sock = request.transport.get_extra_info("socket") if request.transport else None
    conn = admin.conns.get(request.protocol) if admin.conns is not None else None
    refused: web.Response | None = None
    if sock is not None and sock.family == socket.AF_UNIX:
        why = conn.refusal if conn is not None else "who the peer is was not told when it connected"
        if why is not None:
            refused = _text(f"admin API refused: {why}\n", 403)
    elif sock is not None:
        token = admin.token or ""
        given = request.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            refused = _text("missing or wrong bearer token\n", 401)
    if refused is not None:  # answered, and the connection closed: a refused peer holds nothing by asking again
        refused.force_close()
        return refused
    try:
        return await handler(request)
    finally:
        if admin.conns is not None:  # an authorised answer gives the connection admin_request_timeout_s again
            admin.conns.answered(request.protocol)


async def get_tree(request: web.Request) -> web.Response:
    try:
        return _text(request.app[ADMIN].hub.read(request.match_info["path"]))
    except CoreError as exc:
        return _refusal(exc)


async def put_tree(request: web.Request) -> web.Response:
    if request.content_length is not None and request.content_length > 4096:
        return _text("value too long (4096 bytes at most)\n", 413)
    try:
        value = (await request.read()).decode("utf-8")
    except UnicodeDecodeError:
        return _text("value is not UTF-8 text\n", 400)
    try:
        request.app[ADMIN].hub.admin_write(request.match_info["path"], value)
    except CoreError as exc:
        return _refusal(exc)
    except OSError as exc:
        return _text(f"state could not be saved ({exc.strerror}); nothing was changed\n", 507)
    return _text("ok\n")


async def get_status(request: web.Request) -> web.Response:
    return web.json_response(request.app[ADMIN].hub.status().to_json())


def _metrics(registry: CollectorRegistry) -> web.Response:
    """The Prometheus text of ``registry``."""
    return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def get_metrics(request: web.Request) -> web.Response:
    return _metrics(request.app[ADMIN].registry)


def make_admin_app(hub: Hub, token: str | None = None) -> web.Application:
    """The admin app; its server's connections are watched once :meth:`AdminConnections.install` is called on it
    (the daemon does, after the runner's setup)."""
    app = web.Application(middlewares=[admin_auth], client_max_size=8192)
    registry = CollectorRegistry()
    registry.register(ArbiterCollector(hub))
    peers = IdentityResolver("cgroup", "/proc")
    admin = app[ADMIN] = Admin(hub, token, registry, peers, own_pod(peers))
    admin.conns = AdminConnections(lambda sock: peer_refusal(admin, sock), lambda: hub.config.max_admin_clients,
                                   lambda: hub.config.admin_request_timeout_s)
    app.router.add_get(r"/v1/tree{path:(/.*)?}", get_tree)
    app.router.add_put(r"/v1/tree{path:(/.*)?}", put_tree)
    app.router.add_get("/v1/status", get_status)
    app.router.add_get("/metrics", get_metrics)
    return app


def make_metrics_app(admin_app: web.Application) -> web.Application:
    """``GET /metrics`` of ``admin_app``'s registry, and nothing else; its connections are watched once
    :meth:`AdminConnections.install` is called on its server (the daemon does, as for the admin app)."""
    admin = admin_app[ADMIN]
    app = web.Application(client_max_size=1024)
    metrics = app[METRICS] = Admin(admin.hub, None, admin.registry, admin.peers)
    metrics.conns = AdminConnections(lambda sock: None, lambda: admin.hub.config.max_admin_clients,
                                     lambda: admin.hub.config.admin_request_timeout_s)

    async def get_only_metrics(request: web.Request) -> web.Response:
        try:
            return _metrics(request.app[METRICS].registry)
        finally:
            if metrics.conns is not None:
                metrics.conns.answered(request.protocol)

    app.router.add_get("/metrics", get_only_metrics)
    return app


METRICS = web.AppKey("metrics", Admin)

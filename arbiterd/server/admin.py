"""The admin API: the settings tree as plain text, a JSON status document, /metrics.

    GET  /v1/tree/PATH     a file's value, or a folder's listing
    PUT  /v1/tree/PATH     set a file (the body is the value)
    GET  /v1/status        JSON status (cgpu-smi reads it)
    GET  /metrics          Prometheus text format

Refusals answer 4xx with a one-line ``text/plain`` reason and change nothing;
the status comes from the error's type (400 bad value, 403 read-only, 404
unknown path, 409 conflict), and 507 means the state could not be saved. On
loopback TCP every request needs ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from arbiterd.core.errors import CoreError
from arbiterd.server.hub import Hub
from arbiterd.server.metrics import ArbiterCollector

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(slots=True)
class Admin:
    """What the admin handlers work on."""

    hub: Hub
    token: str | None
    registry: CollectorRegistry


ADMIN = web.AppKey("admin", Admin)


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status, content_type="text/plain")


def _refusal(exc: CoreError) -> web.Response:
    reason = str(exc).splitlines()[0] if str(exc) else exc.__class__.__name__
    return _text(reason + "\n", exc.http_status)


@web.middleware
async def token_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is not None and sock.family != socket.AF_UNIX:
        token = request.app[ADMIN].token or ""
        given = request.headers.get("Authorization", "")
        if not token or not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return _text("missing or wrong bearer token\n", 401)
    return await handler(request)


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


async def get_metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[ADMIN].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_admin_app(hub: Hub, token: str | None = None) -> web.Application:
    app = web.Application(middlewares=[token_auth], client_max_size=8192)
    registry = CollectorRegistry()
    registry.register(ArbiterCollector(hub))
    app[ADMIN] = Admin(hub, token, registry)
    app.router.add_get(r"/v1/tree{path:(/.*)?}", get_tree)
    app.router.add_put(r"/v1/tree{path:(/.*)?}", put_tree)
    app.router.add_get("/v1/status", get_status)
    app.router.add_get("/metrics", get_metrics)
    return app

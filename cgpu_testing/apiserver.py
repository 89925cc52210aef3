"""A fake Kubernetes API server (aiohttp, in a thread) for ``resource.k8s.io/v1`` objects and pods, as JSON.

It serves what the DRA plugin, the scheduler model and ``kubectl-inspect-cgpu`` use, at the
paths of the real API (``/apis/resource.k8s.io/v1/resourceslices[/NAME]``,
``/apis/resource.k8s.io/v1/[namespaces/NS/]resourceclaims[/NAME[/status]]``, and the core
group's ``/api/v1/[namespaces/NS/]pods[/NAME]``, where the plugin reads the pod a claim is
reserved for): create (POST, 409 if the name exists), read, list (``fieldSelector=spec.driver=...``
on slices, ``spec.nodeName=...`` on pods; another field is refused with 400, as the real one does), replace (PUT,
409 on a stale ``metadata.resourceVersion``), delete. It assigns ``uid``, ``resourceVersion``
and ``creationTimestamp`` as the real one does.

Every object written through HTTP is checked against the upstream OpenAPI schema of
Kubernetes 1.34 (``kubernetes-validate``, strict: unknown fields fail) and a ResourceSlice's
capacity request policies against the API server's own rules; an invalid one is
refused with 422 and kept in :attr:`FakeApiServer.invalid`, so a test can assert the plugin
never wrote one. Tests reach the store directly too (:meth:`put`, :meth:`get`, :meth:`delete`).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

GROUP = "/apis/resource.k8s.io/v1"
CORE = "/api/v1"
SCHEMA_VERSION = "1.34"
KINDS = {"resourceslices": "ResourceSlice", "resourceclaims": "ResourceClaim", "deviceclasses": "DeviceClass",
         "pods": "Pod"}
API_VERSIONS = {"pods": "v1"}  # the rest: resource.k8s.io/v1
NAMESPACED = ("resourceclaims", "pods")
Key = tuple[str, str, str]  # (plural, namespace or "", name)


def validate(obj: dict[str, Any], version: str = SCHEMA_VERSION) -> str | None:
    """None if ``obj`` is valid for Kubernetes ``version`` (strict), else the validator's one-line reason."""
    import kubernetes_validate  # type: ignore[import-untyped]

    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: {exc.message} at {list(exc.path)}"
    return _request_policies(obj)


def _request_policies(obj: dict[str, Any]) -> str | None:
    """What the API server's own validation says of a ResourceSlice's capacity request policies, beyond the
    schema: kubernetes/kubernetes pkg/apis/resource/validation/validation.go, validateRequestPolicyRange and
    validateRequestPolicyRangeStep (min required and at most the value; default within min..max; max at most the
    value; min + step at most the value; default and max a whole number of steps from min)."""
    from cgpu_dra_plugin.quantity import parse

    if obj.get("kind") != "ResourceSlice":
        return None
    for dev in obj.get("spec", {}).get("devices") or []:
        for name, cap in (dev.get("capacity") or {}).items():
            rng = (cap.get("requestPolicy") or {}).get("validRange")
            if rng is None:
                continue
            where = f"device {dev['name']} capacity {name}"
            value, default = parse(cap["value"]), parse(cap["requestPolicy"].get("default", "0"))
            if "min" not in rng:
                return f"{where}: validRange.min is required"
            lo = parse(rng["min"])
            hi = parse(rng["max"]) if "max" in rng else None
            if lo > value or default < lo or (hi is not None and (lo > hi or hi > value or default > hi)):
                return f"{where}: min, max and default must satisfy min <= default <= max <= value"
            if "step" in rng:
                step = parse(rng["step"])
                if lo + step > value:
                    return f"{where}: one step {lo + step} is larger than the capacity value {value}"
                if (default - lo) % step or (hi is not None and (hi - lo) % step):
                    return f"{where}: default and max must be a multiple of step from min"
    return None


def _status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                              "reason": reason, "code": code}, status=code)


class FakeApiServer:
    """``start()`` serves on 127.0.0.1 (``url``); ``stop()`` ends it."""

    def __init__(self, schema_version: str = SCHEMA_VERSION) -> None:
        self.schema_version = schema_version
        self.objects: dict[Key, dict[str, Any]] = {}
        self.invalid: list[str] = []
        self.writes: list[tuple[str, str, str]] = []  # (method, plural, name) of every HTTP write
        self.on_write: Callable[[str, dict[str, Any]], None] | None = None
        self._rv = itertools.count(1)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------ the store
    def put(self, plural: str, obj: dict[str, Any], check: bool = True) -> dict[str, Any]:
        """Create or replace ``obj`` (no resourceVersion check); the stored copy."""
        obj = copy.deepcopy(obj)
        obj.setdefault("apiVersion", API_VERSIONS.get(plural, "resource.k8s.io/v1"))
        obj.setdefault("kind", KINDS[plural])
        meta = obj.setdefault("metadata", {})
        key = (plural, meta.get("namespace", "") if plural in NAMESPACED else "", meta["name"])
        if check and (reason := validate(obj, self.schema_version)) is not None:
            raise ValueError(reason)
        with self._lock:
            old = self.objects.get(key)
            meta["uid"] = old["metadata"]["uid"] if old else meta.get("uid") or str(uuid.uuid4())
            meta.setdefault("creationTimestamp", old["metadata"]["creationTimestamp"] if old else
                            datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            meta["resourceVersion"] = str(next(self._rv))
            self.objects[key] = obj
            return copy.deepcopy(obj)

    def get(self, plural: str, name: str, namespace: str = "") -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.get((plural, namespace, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, plural: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [copy.deepcopy(o) for (p, ns, _), o in sorted(self.objects.items())
                    if p == plural and (namespace is None or ns == namespace)]

    def delete(self, plural: str, name: str, namespace: str = "") -> bool:
        with self._lock:
            return self.objects.pop((plural, namespace, name), None) is not None

    # ------------------------------------------------------------ HTTP
    def _app(self) -> web.Application:
        app = web.Application()
        for prefix, ns in ((GROUP, False), (GROUP + "/namespaces/{ns}", True), (CORE, False),
                           (CORE + "/namespaces/{ns}", True)):
            app.router.add_get(prefix + "/{plural}", self._list)
            app.router.add_post(prefix + "/{plural}", self._create)
            app.router.add_get(prefix + "/{plural}/{name}", self._read)
            app.router.add_put(prefix + "/{plural}/{name}", self._replace)
            app.router.add_put(prefix + "/{plural}/{name}/status", self._replace)
            app.router.add_delete(prefix + "/{plural}/{name}", self._delete)
            del ns
        return app

    @staticmethod
    def _where(request: web.Request) -> tuple[str, str]:
        plural = request.match_info["plural"]
        core = request.path.startswith(CORE + "/")
        if plural not in KINDS or core != (plural in API_VERSIONS):
            raise web.HTTPNotFound(text=f"no resource {plural}")
        return plural, request.match_info.get("ns", "")

    async def _list(self, request: web.Request) -> web.Response:
        plural, ns = self._where(request)
        items = self.list(plural, ns if "ns" in request.match_info else None)
        selector = request.query.get("fieldSelector", "")
        # the fields each kind may be selected by: ResourceSlice's spec.driver (pkg/registry/resource/resourceslice/
        # strategy.go), Pod's spec.nodeName (pkg/registry/core/pod/strategy.go, PodToSelectableFields); others: 400
        field, _, want = selector.partition("=")
        if selector and (plural, field) not in (("resourceslices", "spec.driver"), ("pods", "spec.nodeName")):
            return _status(400, "BadRequest", f'field label not supported: {field}')
        if selector:
            key = field.split(".")[1]
            items = [o for o in items if o.get("spec", {}).get(key) == want]
        return web.json_response({"apiVersion": API_VERSIONS.get(plural, "resource.k8s.io/v1"),
                                  "kind": KINDS[plural] + "List",
                                  "metadata": {"resourceVersion": str(next(self._rv))}, "items": items})

    async def _read(self, request: web.Request) -> web.Response:
        plural, ns = self._where(request)
        obj = self.get(plural, request.match_info["name"], ns)
        if obj is None:
            return _status(404, "NotFound", f"{plural} \"{request.match_info['name']}\" not found")
        return web.json_response(obj)

    async def _write(self, request: web.Request, create: bool) -> web.Response:
        plural, ns = self._where(request)
        obj = await request.json()
        name = obj.get("metadata", {}).get("name", "")
        if ns:
            obj["metadata"]["namespace"] = ns
        self.writes.append((request.method, plural, name))
        reason = validate(obj, self.schema_version)
        if reason is not None:
            self.invalid.append(reason)
            return _status(422, "Invalid", reason)
        old = self.get(plural, name, ns)
        if create and old is not None:
            return _status(409, "AlreadyExists", f"{plural} \"{name}\" already exists")
        if not create:
            if old is None:
                return _status(404, "NotFound", f"{plural} \"{name}\" not found")
            rv = obj.get("metadata", {}).get("resourceVersion")
            if rv is not None and rv != old["metadata"]["resourceVersion"]:
                return _status(409, "Conflict", f"{plural} \"{name}\": the object has been modified")
        stored = self.put(plural, obj, check=False)
        if self.on_write is not None:
            self.on_write(plural, stored)
        return web.json_response(stored, status=201 if create else 200)

    async def _create(self, request: web.Request) -> web.Response:
        return await self._write(request, True)

    async def _replace(self, request: web.Request) -> web.Response:
        return await self._write(request, False)

    async def _delete(self, request: web.Request) -> web.Response:
        plural, ns = self._where(request)
        name = request.match_info["name"]
        self.writes.append(("DELETE", plural, name))
        if not self.delete(plural, name, ns):
            return _status(404, "NotFound", f"{plural} \"{name}\" not found")
        return web.json_response({"kind": "Status", "apiVersion": "v1", "status": "Success"})

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FakeApiServer:
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._runner = web.AppRunner(self._app())
            loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            loop.run_until_complete(site.start())
            port = self._runner.addresses[0][1]
            self.url = f"http://127.0.0.1:{port}"
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the fake API server did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""arbiterd's admin API over its UNIX socket: the status document and the ``alloc_ctl`` control node."""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Sequence
from typing import Any

from cgpu_device_plugin.node import NodeView, parse_status

ALLOC_CTL = "/v1/tree/alloc_ctl"


class Unreachable(Exception):
    """The admin socket does not answer."""


class Refused(Exception):
    """arbiterd answered 4xx/5xx; the message is its one-line reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class AdminClient:
    """Blocking HTTP/1.1 over ``admin.sock``, one connection per request (a handful per Allocate)."""

    def __init__(self, path: str, timeout: float = 5.0) -> None:
        self.path = path
        self.timeout = timeout

    def request(self, method: str, path: str, body: str | None = None) -> str:
        conn = _UnixConnection(self.path, self.timeout)
        try:
            conn.request(method, path, body=body.encode() if body is not None else None,
                         headers={"Content-Type": "text/plain"})
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"arbiterd admin API at {self.path} does not answer: {exc}") from None
        finally:
            conn.close()
        if resp.status >= 400:
            lines = text.strip().splitlines()
            raise Refused(resp.status, lines[0] if lines else f"HTTP {resp.status} {resp.reason}")
        return text

    def status_doc(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.request("GET", "/v1/status"))
        except json.JSONDecodeError as exc:
            raise Unreachable(f"arbiterd at {self.path} sent a status that is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise Unreachable(f"arbiterd at {self.path} sent a status that is not a JSON object")
        return doc

    def node(self) -> NodeView:
        """The live node; raise Unreachable, or StatusError when the daemon lacks allocation support."""
        return parse_status(self.status_doc())

    def create_allocation(self, alloc_id: str, token_sha256: str, gpus: Sequence[int],
                          memsize: Sequence[int] = (), core: int = 0) -> None:
        """``alloc_ctl create``; raise Refused (409: it would overcommit, or the id exists)."""
        body = f"create {alloc_id} token={token_sha256} gpu={','.join(str(g) for g in gpus)}"
        if memsize:
            body += f" memsize={','.join(str(m) for m in memsize)}"
        if core:
            body += f" core={core}"
        self.request("PUT", ALLOC_CTL, body)

    def remove_allocation(self, alloc_id: str) -> bool:
        """``alloc_ctl remove``; False when arbiterd did not know the id (404)."""
        try:
            self.request("PUT", ALLOC_CTL, f"remove {alloc_id}")
        except Refused as exc:
            if exc.status == 404:
                return False
            raise
        return True

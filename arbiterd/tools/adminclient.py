"""A small HTTP client for arbiterd's admin API, over admin.sock or loopback TCP.

The operator tools (``cgpuctl``, ``cgpu-smi``) and ``cgpu-device-plugin`` all
use it: the settings tree, the status document and the ``alloc_ctl`` control
file. Blocking, one connection per request.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from arbiterd.core.podlabels import PodLabels

DEFAULT_ADMIN = "/run/cgpu/admin.sock"
ALLOC_CTL = "/v1/tree/alloc_ctl"


class Unreachable(Exception):
    """The daemon's admin API cannot be reached."""


class Refused(Exception):
    """The daemon answered with an error (its one-line reason)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


@dataclass
class AdminClient:
    address: str
    token: str | None = None
    timeout: float = 10.0

    @classmethod
    def from_env(cls, address: str | None, token_file: str | None = None) -> AdminClient:
        addr = address or os.environ.get("CGPU_ADMIN") or DEFAULT_ADMIN
        token = os.environ.get("CGPU_ADMIN_TOKEN")
        token_file = token_file or os.environ.get("CGPU_ADMIN_TOKEN_FILE")
        if token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as exc:
                raise Unreachable(f"cannot read token file {token_file}: {exc.strerror}") from None
        return cls(addr, token)

    def _conn(self) -> http.client.HTTPConnection:
        if self.address.startswith("http://"):
            hostport = self.address[len("http://"):].rstrip("/")
            return http.client.HTTPConnection(hostport, timeout=self.timeout)
        return _UnixConnection(self.address, self.timeout)

    def request(self, method: str, path: str, body: str | None = None) -> str:
        headers = {"Content-Type": "text/plain"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._conn()
        try:
            conn.request(method, path, body=body.encode() if body is not None else None, headers=headers)
            resp = conn.getresponse()
            text = resp.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            raise Unreachable(f"cannot reach arbiterd at {self.address}: {exc}") from None
        finally:
            conn.close()
        if resp.status >= 400:
            raise Refused(resp.status, text.strip().splitlines()[0] if text.strip() else resp.reason)
        return text

    @staticmethod
    def tree_path(path: str) -> str:
        p = path.strip()
        for prefix in ("/proc/cgpu_km/", "/proc/cgpu_km"):
            if p.startswith(prefix):
                p = p[len(prefix):]
        p = p.strip("/")
        return "/v1/tree" + ("/" + quote(p) if p else "")

    def get(self, path: str) -> str:
        return self.request("GET", self.tree_path(path))

    def put(self, path: str, value: str) -> str:
        return self.request("PUT", self.tree_path(path), value)

    def status(self) -> dict[str, Any]:
        """The status document; raise Unreachable when what came back is not a JSON object."""
        try:
            doc = json.loads(self.request("GET", "/v1/status"))
        except json.JSONDecodeError as exc:
            raise Unreachable(f"arbiterd at {self.address} sent a status that is not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise Unreachable(f"arbiterd at {self.address} sent a status that is not a JSON object")
        return doc

    def create_allocation(self, alloc_id: str, token_sha256: str, gpus: Sequence[int],
                          memsize: Sequence[int] = (), core: int = 0, weight: int = 0, highprio: bool = False,
                          limit: int = 0, labels: PodLabels | None = None) -> None:
        """``alloc_ctl create``, with the pod ``labels`` of its container where known; raise Refused (409: it would
        overcommit, or the id exists)."""
        body = f"create {alloc_id} token={token_sha256} gpu={','.join(str(g) for g in gpus)}"
        if memsize:
            body += f" memsize={','.join(str(m) for m in memsize)}"
        if core:
            body += f" core={core}"
        if weight:
            body += f" weight={weight}"
        if highprio:
            body += " highprio=1"
        if limit:
            body += f" limit={limit}"
        if labels is not None:
            body += f" {labels.words()}"
        self.request("PUT", ALLOC_CTL, body)

    def label_allocation(self, alloc_id: str, labels: PodLabels) -> None:
        """``alloc_ctl label``: the pod of the container ``alloc_id`` is for; raise Refused (404: no such id)."""
        self.request("PUT", ALLOC_CTL, f"label {alloc_id} {labels.words()}")

    def limit_allocation(self, alloc_id: str, limit: int) -> None:
        """``alloc_ctl limit``: the ceiling (%) of the container ``alloc_id`` is for, 0 for none; raise Refused (404:
        no such id; 400/409: below its core, or the card cannot honour it)."""
        self.request("PUT", ALLOC_CTL, f"limit {alloc_id} {limit or 'none'}")

    def remove_allocation(self, alloc_id: str) -> bool:
        """``alloc_ctl remove``; False when arbiterd did not know the id (404)."""
        try:
            self.request("PUT", ALLOC_CTL, f"remove {alloc_id}")
        except Refused as exc:
            if exc.status == 404:
                return False
            raise
        return True


def add_admin_args(p: argparse.ArgumentParser) -> None:
    """The flags every operator tool takes to find the admin API."""
    p.add_argument("--admin", metavar="ADDR",
                   help="admin.sock path or http://127.0.0.1:PORT (default $CGPU_ADMIN or /run/cgpu/admin.sock)")
    p.add_argument("--token-file", metavar="FILE",
                   help="bearer token for the TCP admin listener (default $CGPU_ADMIN_TOKEN_FILE)")


def run_tool(prog: str, body: Callable[[], int]) -> int:
    """Run a tool: exit 1 when the daemon refused (its reason printed), 3 when it cannot be reached."""
    try:
        return body()
    except KeyboardInterrupt:
        return 0
    except Refused as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 1
    except Unreachable as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 3

"""A fake arbiterd admin API over a UNIX socket: ``GET /v1/status`` and ``alloc_ctl``, nothing else.

It implements exactly the allocation interface the device plugin codes against (create,
remove, list; 400/404/409 with one-line reasons) on simulated GPUs, so the plugin can be
tested, and ``bench.k8s --fake-arbiter`` run, before arbiterd has allocation support.
``stop()``/``start()`` make it go away and come back (a new pid, the same allocations
unless ``forget=True``).
"""

from __future__ import annotations

import json
import re
import socketserver
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

GIB = 1 << 30
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def sim_uuid(index: int) -> str:
    """The UUID arbiterd gives simulated GPU ``index`` (``--sim-gpus``)."""
    return f"GPU-sim-{index:08x}-0000-0000-0000-000000000000"


@dataclass
class FakeGpu:
    index: int
    total_mem: int
    present: bool = True

    @property
    def uuid(self) -> str:
        return sim_uuid(self.index)


@dataclass
class FakeAllocation:
    id: str
    token_sha: str
    gpus: list[int]
    memsize: list[int]
    core: int
    bound: str | None = None


class _Refuse(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class FakeArbiter:
    def __init__(self, path: Path, gpus_gib: list[int] | None = None) -> None:
        self.path = Path(path)
        self.gpus = [FakeGpu(i, gib * GIB) for i, gib in enumerate(gpus_gib or [16, 16])]
        self.allocations: dict[str, FakeAllocation] = {}
        self.requests: list[tuple[str, str, str]] = []  # (method, path, body) of every request
        self.pid = 1000
        self.lock = threading.Lock()
        self.before_create: Callable[[FakeArbiter], None] | None = None  # tests: a racing change
        self._server: socketserver.UnixStreamServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FakeArbiter:
        arbiter = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass  # the test asserts on FakeArbiter.requests instead

            def _reply(self, status: int, body: str, ctype: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                arbiter.requests.append(("GET", self.path, ""))
                if self.path == "/v1/status":
                    self._reply(200, json.dumps(arbiter.status()), "application/json")
                elif self.path == "/v1/tree/alloc_ctl":
                    self._reply(200, arbiter.alloc_ctl_listing())
                else:
                    self._reply(404, f"{self.path}: no such path\n")

            def do_PUT(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                arbiter.requests.append(("PUT", self.path, body))
                if self.path != "/v1/tree/alloc_ctl":
                    self._reply(404, f"{self.path}: no such path\n")
                    return
                try:
                    arbiter.alloc_ctl(body)
                except _Refuse as exc:
                    self._reply(exc.status, f"alloc_ctl: {exc}\n")
                    return
                self._reply(200, "ok\n")

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True

        self.path.unlink(missing_ok=True)
        self._server = Server(str(self.path), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self.path.unlink(missing_ok=True)

    def restart(self, forget: bool = False) -> None:
        """Stop and start as a new process (another pid); ``forget`` loses every allocation."""
        self.stop()
        self.pid += 1
        if forget:
            self.allocations.clear()
        self.start()

    # ------------------------------------------------------------ the interface
    def alloc_mem(self, gpu: int) -> int:
        return sum(m for a in self.allocations.values() for g, m in zip(a.gpus, a.memsize, strict=True) if g == gpu)

    def alloc_core(self, gpu: int) -> int:
        return sum(a.core for a in self.allocations.values() if gpu in a.gpus)

    def status(self) -> dict[str, Any]:
        with self.lock:
            return {
                "version": "0.1.0-fake", "pid": self.pid,
                "gpus": [{"index": g.index, "uuid": g.uuid, "name": "Simulated GPU", "total_mem": g.total_mem,
                          "mem_used": 0, "policy": 1, "max_inst": 16, "free_weight": 16, "instances": [],
                          "alloc_mem": self.alloc_mem(g.index), "alloc_core": self.alloc_core(g.index)}
                         for g in self.gpus if g.present],
                "allocations": [{"id": a.id, "gpus": list(a.gpus), "memsize": list(a.memsize), "core": a.core,
                                 "bound": a.bound} for a in self.allocations.values()],
            }

    def alloc_ctl_listing(self) -> str:
        with self.lock:
            return "".join(
                f"{a.id} gpu={','.join(map(str, a.gpus))} memsize={','.join(map(str, a.memsize)) or 0} "
                f"core={a.core} bound={a.bound or '-'}\n" for a in self.allocations.values())

    def alloc_ctl(self, body: str) -> None:
        words = body.split()
        if len(words) < 2 or words[0] not in ("create", "remove"):
            raise _Refuse(400, f"expected 'create ID ...' or 'remove ID', got {body.strip()!r}")
        op, alloc_id, rest = words[0], words[1], words[2:]
        if not _ID.match(alloc_id):
            raise _Refuse(400, f"{alloc_id!r} is not a valid allocation id")
        with self.lock:
            if op == "remove":
                if rest:
                    raise _Refuse(400, "remove takes only an id")
                if self.allocations.pop(alloc_id, None) is None:
                    raise _Refuse(404, f"no allocation {alloc_id}")
                return
            self._create(alloc_id, rest)

    def add(self, alloc_id: str, gpu: int, memsize: int = 0, core: int = 0) -> None:
        """An allocation made behind the plugin's back (an operator, a racing client)."""
        self.allocations[alloc_id] = FakeAllocation(alloc_id, "0" * 64, [gpu], [memsize], core)

    def _create(self, alloc_id: str, words: list[str]) -> None:
        if self.before_create is not None:
            self.before_create(self)
        fields: dict[str, str] = {}
        for w in words:
            key, eq, value = w.partition("=")
            if not eq or key not in ("token", "gpu", "memsize", "core") or key in fields:
                raise _Refuse(400, f"unexpected {w!r}")
            fields[key] = value
        if not _HEX64.match(fields.get("token", "")):
            raise _Refuse(400, "token= must be 64 hex digits (a SHA-256)")
        try:
            gpus = [int(x) for x in fields["gpu"].split(",")]
            memsize = [int(x) for x in fields["memsize"].split(",")] if "memsize" in fields else []
            core = int(fields.get("core", "0"))
        except (KeyError, ValueError):
            raise _Refuse(400, "gpu=I[,J] is required; memsize and core are integers") from None
        present = {g.index for g in self.gpus if g.present}
        if not gpus or len(set(gpus)) != len(gpus) or any(g not in present for g in gpus):
            raise _Refuse(400, f"gpu={fields['gpu']}: no such GPU")
        if memsize:
            if len(memsize) > len(gpus) or any(m <= 0 for m in memsize):
                raise _Refuse(400, f"memsize={fields['memsize']}: one positive size per GPU")
            memsize += [memsize[-1]] * (len(gpus) - len(memsize))
        else:
            memsize = [0] * len(gpus)
        if not 0 <= core <= 100 or core % 5:
            raise _Refuse(400, f"core={core}: expected a multiple of 5 from 5 to 100")
        if alloc_id in self.allocations:
            raise _Refuse(409, f"allocation {alloc_id} exists")
        for g, m in zip(gpus, memsize, strict=True):
            total = self.gpus[g].total_mem
            if self.alloc_mem(g) + m > total:
                raise _Refuse(409, f"GPU {g}: memsize {m} would overcommit it ({self.alloc_mem(g)} of {total} "
                                   "bytes allocated)")
            if self.alloc_core(g) + core > 100:
                raise _Refuse(409, f"GPU {g}: core={core} would overcommit it ({self.alloc_core(g)} % allocated)")
        self.allocations[alloc_id] = FakeAllocation(alloc_id, fields["token"], gpus, memsize, core)

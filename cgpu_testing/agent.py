"""A client of arbiterd driven line by line, to act as a tenant or an attacker in a process of its own
(tests/security and bench.hostile; :class:`cgpu_testing.cast.Agent` starts it and places it in a container).

    python -m cgpu_testing.agent SOCK [--uid N]

With ``--uid`` it drops to that uid (and its group, with no supplementary groups) once its modules are loaded,
before it connects: so it runs as an unprivileged user although the interpreter lives where only root may read.
It reads one JSON command per line on stdin and answers each with one JSON line on stdout:

    {"op": "connect"}                      -> {"ok": true} | {"error": "..."}
    {"op": "send", "msg": {...}}           -> {"ok": true} | {"error": "..."}
    {"op": "recv", "timeout": S}           -> the next frame | {"closed": true} | {"timeout": true}
    {"op": "hello_register", "register": {...}} -> the answer to register (or the error frame that came instead)
    {"op": "fork_exit"}                    -> {"child": PID}; this process exits at once, its child (holding the
                                              connection) goes on reading the same stdin
    {"op": "flood_connect", "n": N}        -> {"open": k, "refused": r, "errors": {...}}: N more connections, each
                                              greeted, kept open
    {"op": "flood_requests", "seconds": S, "read": false}
                                           -> {"sent": n}: registered connections send requests as fast as they
                                              can; with "read" false they never read a reply
    {"op": "count_open"}                   -> {"open": k}: flood connections the daemon has not closed
    {"op": "enter_cgroup", "dir": D}       -> {"ok": true} | {"error": ...}: move this process into cgroup dir D
    {"op": "flood_register", "seconds": S} -> {"sent": n, "answered": k}: on a new connection, register again and
                                              again as fast as it can (each refused, or refused as a second one)
    {"op": "work", "seconds": S, "op_ms": M, "claim_warmup_ns": W, "claim_transit_ns": T}
                                           -> {"ops": n, "leases": k}: on the connection registered last, run
                                              work under leases as the gate does (acquire; ops of M ms, each
                                              spun on the CPU, while the lease lasts; release and ask again), and
                                              report each lease's use with W ns more warm-up and T ns more transit
                                              than it had (an honest tenant: 0 and 0)
    {"op": "probe", "seconds": S, "gpu": G}
                                           -> {"rtt_ms": [...]}: memory queries on the registered connection, one
                                              every 2 ms, and each one's round trip
    {"op": "admin_get", "sock": A, "path": P, "method": M, "body": B, "zombie": Z}
                                           -> {"status": code, "body": "..."}: M (default GET) P on the admin socket
                                              A (HTTP/1.1); with Z (seconds) the connection is made by a child
                                              that exits Z s later, left a zombie, before the request is sent
    {"op": "flood_unread", "n": N, "gpu": G} -> {"conns": k}: every flood connection sends N registers naming
                                              GPU G at once, and never reads a reply
    {"op": "flood_bytes", "seconds": S, "conns": N, "items": K, "register": {...}}
                                           -> {"sent": n, "frame_bytes": b, "closed": k}: the flood connections send
                                              requests costly to decode (K arrays of K empty maps in one key)
    {"op": "zombie_connect", "sock": S}    -> {"child": PID}: a child connects to S (default: the daemon's socket)
                                              and exits, left unreaped; this process speaks on that connection
    {"op": "close"} | {"op": "exit"}
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack


class Conn:
    def __init__(self, path: str | None, sock: socket.socket | None = None) -> None:
        if sock is None:
            assert path is not None
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.connect(path)
        self.sock = sock
        self.unpacker = msgpack.Unpacker(raw=False)

    def send(self, msg: dict[str, Any]) -> None:
        self.sock.sendall(msgpack.packb(msg, use_bin_type=True))

    def recv(self, timeout: float = 5.0) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            for frame in self.unpacker:
                return dict(frame)
            left = end - time.monotonic()
            if left <= 0:
                return {"timeout": True}
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                return {"timeout": True}
            except OSError as exc:
                return {"closed": True, "errno": exc.errno}
            if not data:
                return {"closed": True}
            self.unpacker.feed(data)

    def alive(self) -> bool:
        """Whether the daemon has not closed this connection (what it sent is drained)."""
        try:
            while select.select([self.sock], [], [], 0)[0]:
                if not self.sock.recv(65536):
                    return False
        except OSError:
            return False
        return True


def work(conn: Conn, cmd: dict[str, Any]) -> dict[str, Any]:
    """Ops under leases, as the gate runs them; a lease's use reported with the claims asked for."""
    gpu, op_s = cmd.get("gpu", 0), cmd.get("op_ms", 0.5) / 1e3
    claim_warmup, claim_transit = cmd.get("claim_warmup_ns", 0), cmd.get("claim_transit_ns", 0)
    end = time.monotonic() + cmd["seconds"]
    ops = leases = 0
    conn.send({"op": "acquire", "id": 1, "gpu": gpu})
    while time.monotonic() < end:
        msg = conn.recv(10.0)
        if msg.get("op") != "grant":
            if msg.get("timeout") or msg.get("closed"):
                return {"error": str(msg), "ops": ops, "leases": leases}
            continue  # a revoke of a lease already given back, or a reply
        got = time.monotonic_ns()
        leases += 1
        deadline, revoked = msg["deadline_ns"], False
        while not revoked and time.monotonic_ns() + op_s * 1e9 <= deadline and time.monotonic() < end:
            stop = time.perf_counter() + op_s
            while time.perf_counter() < stop:  # the op, spun: a GPU kernel the lease pays for
                pass
            ops += 1
            conn.sock.setblocking(False)
            try:
                data = conn.sock.recv(65536)
                conn.unpacker.feed(data)
            except BlockingIOError:
                pass
            finally:
                conn.sock.setblocking(True)
            for frame in conn.unpacker:
                revoked = revoked or (frame.get("op") == "revoke" and frame.get("lease") == msg["lease"])
        used = max(0, time.monotonic_ns() - got - claim_transit)
        conn.send({"op": "release", "gpu": gpu, "lease": msg["lease"], "again": True, "used_ns": used,
                   "warmup_ns": claim_warmup})
    return {"ops": ops, "leases": leases}


def flood_register(path: str, seconds: float) -> dict[str, Any]:
    c = Conn(path)
    c.send({"op": "hello", "versions": [1], "client": "flood"})
    c.recv()
    batch = b"".join(msgpack.packb({"op": "register", "id": i, "gpus": [0], "instance": None}) for i in range(500))
    answered = [0]

    def drain() -> None:
        with contextlib.suppress(OSError):
            while data := c.sock.recv(1 << 20):
                c.unpacker.feed(data)
                answered[0] += sum(1 for _ in c.unpacker)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    sent = 0
    c.sock.settimeout(5.0)
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            c.sock.sendall(batch)
            sent += 500
    except OSError:
        return {"sent": sent, "answered": answered[0], "closed": True}
    return {"sent": sent, "answered": answered[0]}


def flood_bytes(conns: list[Conn], seconds: float, items: int, register: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """On greeted connections, send as fast as they can requests that cost much to decode and little to refuse: a
    ``mem_query`` with one more key holding ``items`` arrays of ``items`` empty maps (64: about 4 KiB, 4 160
    items; 4096 would make a frame of 64 KiB and 61 000 maps, past what the daemon takes now). Each is answered
    ``bad_request`` and the connection stays; the replies are read. With ``register`` each connection registers
    so first (a greeted connection that does not is closed at idle_timeout_s)."""
    if register is not None:
        for c in conns:
            c.send({"op": "register", "id": 1, "gpus": [1], **register})
            c.recv(5.0)
    rows = items if items <= 64 else 61_000 // items
    frame = msgpack.packb({"op": "mem_query", "id": 1, "gpu": 1, "x": [[{}] * items] * rows})
    batch = frame * max(1, 65536 // len(frame))
    sent = closed = 0
    for c in conns:
        c.sock.setblocking(False)
    end = time.monotonic() + seconds
    live = list(conns)
    left = {id(c): b"" for c in conns}  # what a partial send left of a batch: sent first, so frames stay whole
    while time.monotonic() < end and live:
        for c in list(live):
            try:
                out = left[id(c)] or batch
                n = c.sock.send(out)
                left[id(c)] = out[n:]
                sent += (len(batch) - len(left[id(c)])) // len(frame) if not left[id(c)] else 0
            except BlockingIOError:
                pass
            except OSError:
                live.remove(c)
                closed += 1
                continue
            try:
                while c.sock.recv(1 << 20):
                    pass
            except BlockingIOError:
                pass
            except OSError:
                live.remove(c)
                closed += 1
        time.sleep(0.0005)
    return {"sent": sent, "frame_bytes": len(frame), "closed": closed}


def zombie_connected(sock_path: str, linger: float = 0.0) -> tuple[socket.socket, int]:
    """A socket connected to ``sock_path`` by a child that then exited (``linger`` s later, so that a running
    daemon accepts it while it lives) and is left unreaped (a zombie), so the kernel names the zombie as the peer
    (SO_PEERCRED) while this process speaks on the connection."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    child = os.fork()
    if child == 0:
        try:
            s.connect(sock_path)
            time.sleep(linger)
        finally:
            os._exit(0)
    end = time.monotonic() + 5
    while time.monotonic() < end:  # until it is a zombie: state Z in /proc/<pid>/stat
        stat = Path(f"/proc/{child}/stat").read_bytes()
        if stat[stat.rfind(b")") + 2:].startswith(b"Z"):
            break
        time.sleep(0.01)
    return s, child


def admin_get(sock_path: str, path: str, method: str = "GET", body: str = "", zombie: float | None = None
              ) -> dict[str, Any]:
    """``method`` ``path`` (with ``body``) on the admin API at ``sock_path``: the status code and the body. With
    ``zombie`` the connection is made by a child left a zombie ``zombie`` s after it connected
    (:func:`zombie_connected`)."""
    if zombie is not None:
        s, _ = zombie_connected(sock_path, zombie)
    else:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
    with s:
        s.settimeout(10)
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: arbiterd\r\nConnection: close\r\n"
                  f"Content-Length: {len(body.encode())}\r\n\r\n{body}".encode())
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, answer = raw.partition(b"\r\n\r\n")
    return {"status": int(head.split()[1]) if head else 0, "body": answer.decode(errors="replace")}


def drop_to(uid: int) -> None:
    import pwd

    gid = pwd.getpwuid(uid).pw_gid if uid in {p.pw_uid for p in pwd.getpwall()} else uid
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)


def main() -> int:
    path = sys.argv[1]
    if "--uid" in sys.argv:
        drop_to(int(sys.argv[sys.argv.index("--uid") + 1]))
    conn: Conn | None = None
    flood: list[Conn] = []

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "connect":
                conn = Conn(path)
                reply({"ok": True})
            elif op == "send":
                assert conn is not None
                conn.send(cmd["msg"])
                reply({"ok": True})
            elif op == "recv":
                assert conn is not None
                reply(conn.recv(cmd.get("timeout", 5.0)))
            elif op == "hello_register":
                conn = Conn(path)
                conn.send({"op": "hello", "versions": [1], "client": "agent"})
                first = conn.recv()
                if first.get("op") != "welcome":
                    reply(first)
                    continue
                conn.send({"op": "register", "id": 1, "gpus": [0], **cmd.get("register", {})})
                reply(conn.recv())
            elif op == "admin_get":
                reply(admin_get(cmd["sock"], cmd["path"], cmd.get("method", "GET"), cmd.get("body", ""),
                                cmd.get("zombie")))
            elif op == "zombie_connect":
                zsock, child = zombie_connected(cmd.get("sock", path))
                conn = Conn(None, zsock)
                reply({"child": child})
            elif op == "fork_exit":
                child = os.fork()
                if child:
                    reply({"child": child})
                    os._exit(0)
            elif op == "flood_connect":
                opened = refused = 0
                errors: dict[str, int] = {}
                for _ in range(cmd["n"]):
                    try:
                        c = Conn(path)
                        # the daemon may refuse at accept and close before the hello is written: its refusal
                        # is still there to read
                        with contextlib.suppress(BrokenPipeError):
                            c.send({"op": "hello", "versions": [1], "client": "flood"})
                        answer = c.recv(5.0)
                    except OSError as exc:
                        errors[exc.__class__.__name__] = errors.get(exc.__class__.__name__, 0) + 1
                        continue
                    if answer.get("op") == "welcome":
                        opened += 1
                        flood.append(c)
                    else:
                        refused += 1
                        errors[str(answer.get("code", answer))] = errors.get(str(answer.get("code", answer)), 0) + 1
                        c.sock.close()
                reply({"open": opened, "refused": refused, "errors": errors})
            elif op == "flood_requests":
                sent = 0
                conns = []
                for i, c in enumerate(flood[: cmd.get("conns", 8)]):
                    c.send({"op": "register", "id": 1, "gpus": [cmd.get("gpu", 0)], **cmd.get("register", {})})
                    c.recv(5.0)
                    conns.append((i, c))
                frames = b"".join(msgpack.packb(m) for m in (
                    {"op": "acquire", "id": 2, "gpu": cmd.get("gpu", 0)},
                    {"op": "stats", "id": 3},
                    {"op": "mem_query", "id": 4, "gpu": cmd.get("gpu", 0)},
                )) * 50
                end = time.monotonic() + cmd["seconds"]
                for _, c in conns:
                    c.sock.setblocking(False)
                while time.monotonic() < end:
                    for _, c in conns:
                        try:
                            c.sock.send(frames)
                            sent += 150
                        except (BlockingIOError, OSError):
                            pass
                        if cmd.get("read", True):
                            try:
                                while c.sock.recv(1 << 20):
                                    pass
                            except (BlockingIOError, OSError):
                                pass
                    time.sleep(0.0005)
                reply({"sent": sent})
            elif op == "flood_unread":  # every flood connection sends N registers naming GPU G, reading no reply
                frames = msgpack.packb({"op": "register", "id": 7, "instance": None, "gpus": [cmd["gpu"]]}) * cmd["n"]
                pending = {id(c): memoryview(frames) for c in flood}
                for c in flood:
                    c.sock.setblocking(False)
                end = time.monotonic() + cmd.get("seconds", 3.0)
                while any(len(v) for v in pending.values()) and time.monotonic() < end:
                    for c in flood:
                        with contextlib.suppress(BlockingIOError, OSError):
                            pending[id(c)] = pending[id(c)][c.sock.send(pending[id(c)]):]
                    time.sleep(0.001)
                reply({"conns": len(flood), "unsent": sum(len(v) for v in pending.values())})
            elif op == "flood_bytes":
                reply(flood_bytes(flood[: cmd.get("conns", 8)], cmd["seconds"], cmd.get("items", 64),
                                  cmd.get("register")))
            elif op == "work":
                assert conn is not None
                reply(work(conn, cmd))
            elif op == "probe":
                assert conn is not None
                rtt = []
                end = time.monotonic() + cmd["seconds"]
                n = 0
                while time.monotonic() < end:
                    n += 1
                    t0 = time.perf_counter()
                    conn.send({"op": "mem_query", "id": 10_000 + n, "gpu": cmd.get("gpu", 0)})
                    answer = conn.recv()
                    while answer.get("op") in ("grant", "revoke"):
                        answer = conn.recv()
                    if answer.get("op") != "ok":
                        reply({"error": str(answer)})
                        break
                    rtt.append((time.perf_counter() - t0) * 1e3)
                    time.sleep(0.002)
                else:
                    reply({"rtt_ms": rtt})
            elif op == "flood_register":
                reply(flood_register(path, cmd["seconds"]))
            elif op == "enter_cgroup":
                Path(cmd["dir"], "cgroup.procs").write_text(str(os.getpid()))
                reply({"ok": True})
            elif op == "count_open":
                reply({"open": sum(c.alive() for c in flood)})
            elif op == "close":
                if conn is not None:
                    conn.sock.close()
                    conn = None
                reply({"ok": True})
            elif op == "exit":
                reply({"ok": True})
                return 0
        except OSError as exc:
            reply({"error": f"{exc.__class__.__name__}: {exc.strerror or exc}", "errno": exc.errno})
    return 0


if __name__ == "__main__":
    sys.exit(main())

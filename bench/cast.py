"""Tenants and attackers as processes of their own, in containers or on the host, for tests/security and
bench.hostile.

:class:`Agent` runs ``bench.agent`` (a client driven one JSON line at a time); with a uid it drops to it before it
connects, so a host attacker runs as an unprivileged user. :class:`Containers` puts a process in a container:
a real cgroup (``/docker/<64 hex>`` under the cgroup v1 pids hierarchy or cgroup v2) when this runs as root and a
hierarchy is writable, else an entry of a fake ``/proc`` that the daemon reads through ``--proc-root`` (where
every other peer, host processes included, must have an entry too: :meth:`Containers.place` writes one).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, tool

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
_HIERARCHIES = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))


def fake_cgroup(proc_root: Path, pid: int, cgroup: str) -> None:
    """In a fake /proc that arbiterd reads through ``--proc-root``: give process ``pid`` the cgroup file
    ``cgroup`` (its lines, ``N:controllers:/path``; a bare path is a cgroup v2 line), and make each of its cgroups'
    directories, owned by this user, in a fake cgroup fs beside it, mounted as the fake /proc's mount table says
    (arbiterd checks who made a container's cgroup: arbiterd/server/cgroups.py)."""
    fs = proc_root.parent / f"{proc_root.name}-cgroupfs"
    mountinfo = proc_root / "self" / "mountinfo"
    mountinfo.parent.mkdir(parents=True, exist_ok=True)
    table = mountinfo.read_text() if mountinfo.exists() else ""
    lines = [line if ":" in line else f"0::{line}" for line in cgroup.strip().splitlines()]
    for line in lines:
        _, controllers, path = line.split(":", 2)
        name = controllers or "unified"
        point = fs / name.replace("=", "_").replace(",", "_")
        if f" {point} " not in table:
            kind = f"cgroup cgroup rw,{controllers}" if controllers else "cgroup2 cgroup2 rw"
            table += f"{30 + table.count(chr(10))} 23 0:26 / {point} rw,relatime - {kind}\n"
        (point / path.lstrip("/")).mkdir(parents=True, exist_ok=True)
    mountinfo.write_text(table)
    entry = proc_root / str(pid)
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "cgroup").write_text("".join(line + "\n" for line in lines))


def writable_hierarchy() -> Path | None:
    """A cgroup hierarchy where this process may make container groups (root only), if any."""
    if not IS_ROOT:
        return None
    for base in _HIERARCHIES:
        probe = base / "docker" / ("f" * 64)
        try:
            probe.mkdir(parents=True, exist_ok=True)
            (probe / "cgroup.procs").stat()
            probe.rmdir()
            return base
        except OSError:
            continue
    return None


class DaemonProc:
    """``arbiterd`` as a subprocess with its own run and state dirs."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None,
                 wrap: list[str] | None = None) -> None:
        self.tmp = tmp
        self.wrap = wrap or []
        self.run_dir = tmp / "run"
        self.state_dir = tmp / "state"
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = tmp / "arbiterd.log"

    @property
    def sock(self) -> str:
        return str(self.run_dir / "arbiter.sock")

    @property
    def admin(self) -> str:
        return str(self.run_dir / "admin.sock")

    def start(self, timeout: float = 15.0) -> DaemonProc:
        cmd = [*self.wrap, tool("arbiterd"), "--run-dir", str(self.run_dir), "--state-dir", str(self.state_dir),
               *self.args]
        self.log = open(self.log_path, "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"arbiterd exited with {self.proc.returncode}:\n{self.read_log()}")
            if _accepts(self.sock) and _accepts(self.admin):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"arbiterd did not start:\n{self.read_log()}")

    def read_log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([tool("cgpuctl"), "--admin", self.admin, *args], capture_output=True,
                              text=True, timeout=30)

    def smi_json(self) -> dict[str, Any]:
        """``cgpu-smi --json`` against this daemon, parsed."""
        out = subprocess.run([tool("cgpu-smi"), "--admin", self.admin, "--json"], capture_output=True,
                             text=True, check=True, timeout=30).stdout
        return json.loads(out)  # type: ignore[no-any-return]


def _accepts(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def give_cgroup(group: Path, uid: int) -> None:
    """Make cgroup dir ``group`` (and those above it that are missing) and hand it to ``uid``, as systemd delegates
    ``user@<uid>.service`` to its user: that user may then make cgroups under it and move its processes there."""
    group.mkdir(parents=True, exist_ok=True)
    os.chown(group, uid, uid)
    for name in ("cgroup.procs", "tasks"):
        if (group / name).exists():
            os.chown(group / name, uid, uid)


def forge_container(hierarchy: Path, agent: Agent, uid: int, cid: str) -> tuple[list[Path], str | None]:
    """Do what a user can where systemd delegates ``user@<uid>.service`` to it: with ``agent`` (running as ``uid``)
    in that subtree, make a cgroup under it named after container ``cid`` and move the agent there. Returns the
    cgroups made (for :func:`remove_cgroups`, deepest first) and why it could not be done, if it could not."""
    delegated = hierarchy / "user.slice" / f"user@{uid}.service"
    forged = delegated / "docker" / cid
    made = [forged, forged.parent, delegated, delegated.parent]
    give_cgroup(delegated, uid)
    give_cgroup(forged.parent, uid)
    moved = agent.call("enter_cgroup", dir=str(delegated))  # one of its own processes, as under systemd
    if "error" in moved:
        return made, f"this hierarchy does not let a user move itself: {moved['error']}"
    give_cgroup(forged, uid)  # as if the user made it: its own
    moved = agent.call("enter_cgroup", dir=str(forged))
    return made, moved.get("error")


def remove_cgroups(*groups: Path) -> None:
    """Remove cgroup dirs, deepest first, ending any process still in one."""
    for group in groups:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                with contextlib.suppress(OSError, ValueError):
                    for pid in (group / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                time.sleep(0.02)


class Containers:
    """Puts processes into containers: real cgroups where it can, else a fake /proc for the daemon to read."""

    def __init__(self, tmp: Path) -> None:
        self.hierarchy = writable_hierarchy()
        self.real = self.hierarchy is not None
        self.proc_root = tmp / "proc"
        self.made: list[Path] = []

    def daemon_args(self) -> list[str]:
        return [] if self.real else ["--proc-root", str(self.proc_root)]

    @staticmethod
    def new_id() -> str:
        return secrets.token_hex(32)

    def place(self, pid: int, cid: str | None) -> None:
        """Put process ``pid`` in container ``cid`` (None: leave it on the host)."""
        if self.hierarchy is not None:
            if cid is None:
                return
            group = self.hierarchy / "docker" / cid
            group.mkdir(parents=True, exist_ok=True)
            if group not in self.made:
                self.made.append(group)
            (group / "cgroup.procs").write_text(str(pid))
            return
        fake_cgroup(self.proc_root, pid, f"/docker/{cid}" if cid else "/user.slice/user-0.slice")

    def cleanup(self) -> None:
        """Remove the cgroups made, ending any process still in one (a child an agent forked, say)."""
        remove_cgroups(*self.made)


class Agent:
    """A tenant or attacker process (bench.agent), driven one JSON line at a time."""

    def __init__(self, sock: str, containers: Containers, cid: str | None = None, uid: int | None = None) -> None:
        args = [sys.executable, "-m", "bench.agent", sock] + (["--uid", str(uid)] if uid is not None else [])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env=env)
        self.pid = self.proc.pid
        containers.place(self.pid, cid)

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise ConnectionError(f"agent {self.pid} ended")
        return json.loads(line)  # type: ignore[no-any-return]

    def register(self, instance: str | None = None, **kw: Any) -> dict[str, Any]:
        return self.call("hello_register", register={"instance": instance, **kw})

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Cast:
    """Daemons started by hand and the tenants and attackers around them, all ended by :meth:`cleanup`."""

    def __init__(self, tmp: Path) -> None:
        os.chmod(tmp, 0o755)  # an unprivileged agent must reach the socket
        self.tmp = tmp
        self.containers = Containers(tmp)
        if not self.containers.real:
            self.containers.place(os.getpid(), None)  # this process's own clients are host processes
        self.daemons: list[DaemonProc] = []
        self.agents: list[Agent] = []

    def daemon(self, *args: str, sub: str = "d", start: bool = True) -> DaemonProc:
        """arbiterd in ``tmp/sub`` (its run and state dirs there), reading the cast's /proc."""
        d = DaemonProc(self.tmp / sub, *self.containers.daemon_args(), *args)
        d.tmp.mkdir(parents=True, exist_ok=True)
        self.daemons.append(d)
        return d.start() if start else d

    def agent(self, d: DaemonProc, cid: str | None = None, uid: int | None = None) -> Agent:
        """An agent for ``d``, in container ``cid`` (None: on the host), as ``uid`` (None: this process's)."""
        a = Agent(d.sock, self.containers, cid, uid)
        self.agents.append(a)
        return a

    def cleanup(self) -> None:
        for a in self.agents:
            a.stop()
        for d in self.daemons:
            if d.proc is not None and d.proc.poll() is None:
                d.stop()
        self.containers.cleanup()

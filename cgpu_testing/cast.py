"""Tenants and attackers as processes of their own, in containers or on the host, for tests/security and
bench.hostile.

:class:`Agent` runs :mod:`cgpu_testing.agent` (a client driven one JSON line at a time); with a uid it drops to it
before it connects, so a host attacker runs as an unprivileged user. :class:`Cast` starts daemons
(:class:`~cgpu_testing.daemon.DaemonProc`) that read its containers (:class:`~cgpu_testing.containers.Containers`)
and the agents around them, and ends them all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cgpu_testing.containers import Containers, give_cgroup
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import root_on_path


class Agent:
    """A tenant or attacker process (:mod:`cgpu_testing.agent`), driven one JSON line at a time."""

    def __init__(self, sock: str, containers: Containers, cid: str | None = None, uid: int | None = None) -> None:
        args = [sys.executable, "-m", "cgpu_testing.agent", sock] + (["--uid", str(uid)] if uid is not None else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
                                     env=root_on_path())
        self.pid = self.proc.pid
        containers.place(self.pid, cid)

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        self.begin(op, **kw)
        return self.result()

    def begin(self, op: str, **kw: Any) -> None:
        """Send the command; :meth:`result` reads its answer (meanwhile the caller may, say, resume a daemon)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()

    def result(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
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
            if d.running():
                d.stop()
        self.containers.cleanup()


def forge_container(hierarchy: Path, agent: Agent, uid: int, cid: str) -> tuple[list[Path], str | None]:
    """Do what a user can where systemd delegates ``user@<uid>.service`` to it: with ``agent`` (running as ``uid``)
    in that subtree, make a cgroup under it named after container ``cid`` and move the agent there. Returns the
    cgroups made (for :func:`~cgpu_testing.containers.remove_cgroups`, deepest first) and why it could not be
    done, if it could not."""
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

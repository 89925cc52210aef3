"""The attack battery: hostile tenants and host users against a victim container, at the daemon's defaults.

    python -m bench.hostile [--json] [--seconds 40] [--no-write]

arbiterd runs at its defaults on two simulated GPUs, started by hand; the one setting changed is ``client_mode =
0666``, so that host users reach the daemon at all (at the default 0660 they cannot connect, which is attack 1).
An operator puts GPU 0 on policy 2 with ``max_inst`` 2. A victim container (weight 1) works there beside a
container that lies about every lease (90 ms of warm-up and 20 ms of transit claimed each time), at 1:1; a second
process of the victim measures its round trip (a memory query every 2 ms). First the victim runs alone, then beside
the liar while the floods run (connections, requests, requests costly to decode, replies never read, idle
greetings) on GPU 1; the one-shot attacks (identity, zombies on both sockets, GPU shaping, names, planted files,
connection slots and descriptors across tenants, idle admin TCP connections, environment greed, containment evaded
by a handshake) run before, each against a daemon of its own where it needs one.
Last the daemon is killed with SIGKILL and started again, then again after a bad record was put in its state
file: the operator's settings must all be back.

Host attackers run as ``nobody``; containers are real cgroups when this runs as root, else a fake /proc
(cgpu_testing/cast.py). The output ends with ``attacks=<n> refused=<n> victim_share_pct=<x> victim_rtt_p99_ms=<x>
state_kept=<0|1>``; targets: every attack refused, the victim's share within 3 points of 50, its p99 at most 5 ms
during the floods, and state kept. The table goes to bench/RESULTS.md (section ``hostile``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arbiterd.server.config import Config
from bench import results
from cgpu_testing.cast import Agent, Cast, forge_container
from cgpu_testing.containers import IS_ROOT, NOBODY, remove_cgroups
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import still_open

GPUS = "2x16GiB"
LIE = {"claim_warmup_ns": 90_000_000, "claim_transit_ns": 20_000_000}


@dataclass
class Outcome:
    attack: str
    by: str
    refused: bool
    how: str


class Battery(Cast):
    """The cast of the battery, and what became of each attack."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.outcomes: list[Outcome] = []

    def record(self, attack: str, by: str, refused: bool, how: str) -> None:
        how = how.replace(str(self.tmp), "$TMP")  # the table names no path of this machine
        self.outcomes.append(Outcome(attack, by, refused, how))
        print(f"  {'refused' if refused else 'NOT REFUSED':12s} {attack} ({by}): {how}", flush=True)

    def attempt(self, attack: str, by: str, run: Callable[[], tuple[bool, str]]) -> None:
        try:
            refused, how = run()
        except Exception as exc:  # an attack that breaks the bench counts as not refused, with why
            refused, how = False, f"bench error: {exc.__class__.__name__}: {exc}"
        self.record(attack, by, refused, how)


def refused_with(reply: dict[str, Any], code: str) -> tuple[bool, str]:
    ok = reply.get("op") == "error" and reply.get("code") == code
    return ok, str(reply.get("message", reply))[:140]


def one_shots(b: Battery, d: DaemonProc, victim: str) -> None:
    """Identity, shaping and names, against the main daemon; planted files against daemons of their own."""
    print("one-shot attacks:", flush=True)
    closed = b.daemon("--sim-gpus", GPUS, sub="closed")  # the default socket mode
    b.attempt("connect to a daemon started by hand at its defaults", "host user",
              lambda: (("PermissionError" in (r := b.agent(closed, uid=NOBODY).call("connect")).get("error", "")),
                       str(r)))
    closed.stop()
    b.attempt("register as a provisioned container", "host user",
              lambda: refused_with(b.agent(d, uid=NOBODY).register(victim[:12], memsize=[900 << 20]), "identity"))
    squat = b.containers.new_id()
    b.attempt("squat an id before its container comes, memsize 1", "host user",
              lambda: refused_with(b.agent(d, uid=NOBODY).register(squat[:12], memsize=[1]), "identity"))
    b.attempt("register as another uid's instance", "host user",
              lambda: refused_with(b.agent(d, uid=NOBODY).register("uid-0"), "identity"))
    b.attempt("make instance records without end", "host user", lambda: _records(b, d))
    b.attempt("forge a container's cgroup in a subtree it owns, and be that container", "host user",
              lambda: _forge(b, d, victim))
    b.attempt("declare another container's id", "container",
              lambda: refused_with(b.agent(d, cid=b.containers.new_id()).register(victim[:12]), "identity"))
    b.attempt("shed its identity: connect, fork, exit", "container", lambda: _shed(b))
    b.attempt("switch an unused GPU to policy 3 (core=100)", "container", lambda: _shape(b))
    b.attempt("take all free weight, leaving the next at weight 0 (client_env_max_weight 25)", "container",
              lambda: _fill(b))
    b.attempt("an id with a trailing newline", "container",
              lambda: refused_with(b.agent(d, uid=NOBODY).register("uid-65534\n"), "bad_request"))
    b.attempt("plant the run dir (owned by another user)", "host user", lambda: _planted_dir(b, "owned"))
    b.attempt("plant the run dir (writable by every user)", "host user", lambda: _planted_dir(b, "writable"))
    b.attempt("plant admin.token", "host user", lambda: _planted_token(b))
    b.attempt("a symlink at the socket's path", "host user", lambda: _symlink(b))
    b.attempt("a frame that is not msgpack", "container", lambda: _bad_frame(b, d))
    b.attempt("connect from a child left a zombie, then register as the host (arbiter.sock)", "container",
              lambda: _zombie_client(b))
    b.attempt("connect to admin.sock from a child left a zombie, then provision weight=8 highprio=1", "container",
              lambda: _zombie_admin(b))
    b.attempt("four containers hold all the connections they may; a fifth and root's cgpuctl come later "
              "(descriptor soft limit 1024)", "container", lambda: _slots(b))
    b.attempt("hold 1006 idle TCP connections to the admin listener", "host user", lambda: _admin_tcp(b))
    b.attempt("a weight of 14 and high priority from its environment, beside a provisioned weight-2 victim",
              "container", lambda: _greed(b))
    b.attempt("connect to arbiter.sock every 10 s, never registering, to pass for managed (unmanaged = kill, "
              "memory_enforce = kill)", "container", lambda: _handshake(b))


def _records(b: Battery, d: DaemonProc) -> tuple[bool, str]:
    a = b.agent(d, uid=NOBODY)
    made = [a.register(f"n{i}").get("op") == "registered" for i in range(70)]
    return not any(made), f"{sum(made)} of 70 names registered (a host uid is uid-<uid> or what it was provisioned)"


def _forge(b: Battery, d: DaemonProc, victim: str) -> tuple[bool, str]:
    """systemd delegates user@<uid>.service to its user, who may make any cgroup under it and move there."""
    if b.containers.hierarchy is None:
        return True, "no writable cgroup hierarchy here to forge in (fake /proc)"
    forger = b.agent(d, uid=NOBODY)
    made, why_not = forge_container(b.containers.hierarchy, forger, NOBODY, victim)
    try:
        if why_not:
            return True, why_not
        return refused_with(forger.register(victim[:12], memsize=[400 << 20]), "identity")
    finally:
        forger.stop()
        remove_cgroups(*made)


def _shed(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub="shed")
    cid = b.containers.new_id()
    shedder = b.agent(d, cid=cid)
    with d.stopped():
        shedder.call("connect")
        shedder.call("fork_exit")
        shedder.proc.wait(5)
    first = shedder.call("recv")
    d.stop()
    return refused_with(first, "identity")


def _shape(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub="shape")
    grab = b.agent(d, cid=b.containers.new_id()).register(core_percent=100)
    policy, max_inst = d.ctl("cat", "0/policy").stdout.strip(), d.ctl("cat", "0/max_inst").stdout.strip()
    late = b.agent(d, cid=b.containers.new_id()).register()
    d.stop()
    took = grab["gpus"][0]["weight"]
    return ((policy, max_inst) == ("1", "16") and late.get("op") == "registered",
            f"the GPU kept policy {policy} and max_inst {max_inst}; the grabber got weight {took} "
            f"(client_env_max_weight); the next container {late.get('op')}")


def _fill(b: Battery) -> tuple[bool, str]:
    """With the environment trusted as cGPU trusts it (client_env_max_weight 25): the overcommit rule holds."""
    d = b.daemon("--sim-gpus", GPUS, "--client-env-max-weight", "25", sub="fill")
    b.agent(d, cid=b.containers.new_id()).register(weight=16)
    late = b.agent(d, cid=b.containers.new_id()).register()
    ok, how = refused_with(late, "refused")
    d.stop(signal.SIGKILL)
    d.start()  # the flags stay: the same daemon comes back
    kept = "no free weight" in how and d.ctl("cat", "inst_ctl").returncode == 0
    d.stop()
    return ok and kept, how


def _planted_dir(b: Battery, how: str) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub=f"planted-{how}", start=False)
    d.run_dir.mkdir(parents=True)
    if how == "owned":
        os.chown(d.run_dir, NOBODY, NOBODY)
    else:
        os.chmod(d.run_dir, 0o777)
    try:
        d.start()
    except RuntimeError as exc:
        line = next((x for x in str(exc).splitlines() if "cannot start" in x), str(exc).strip()[-140:])
        return d.stop() == 1 and not Path(d.sock).exists(), line.split("cannot start: ")[-1][:140]
    d.stop()
    return False, "started in it"


def _planted_token(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, "--admin-listen", "127.0.0.1:0", sub="token", start=False)
    d.state_dir.mkdir(parents=True, mode=0o700)
    token = d.state_dir / "admin.token"
    token.write_text("0" * 64 + "\n")
    os.chown(token, NOBODY, NOBODY)
    try:
        d.start()
    except RuntimeError as exc:
        line = next((x for x in str(exc).splitlines() if "cannot start" in x), str(exc))
        return "planted" in line, line.split("cannot start: ")[-1][:140]
    return False, "started with a token nobody planted"


def _symlink(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub="symlink", start=False)
    d.run_dir.mkdir(parents=True, mode=0o755)
    target = b.tmp / "precious"
    target.write_text("x")
    os.chmod(target, 0o600)
    (d.run_dir / "arbiter.sock").symlink_to(target)
    d.start()
    mode = target.stat().st_mode & 0o777
    d.stop()
    return mode == 0o600, f"the link's target kept mode {mode:04o}; the socket was made in its place"


def _bad_frame(b: Battery, d: DaemonProc) -> tuple[bool, str]:
    a = b.agent(d, cid=b.containers.new_id())
    assert a.register(gpus=[1])["op"] == "registered"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # garbage, from a process of the host
    s.connect(d.sock)
    s.sendall(b"\xc1" * 64)
    s.settimeout(5)
    answer = s.recv(4096)
    s.close()
    a.call("send", msg={"op": "mem_query", "id": 5, "gpu": 1})
    other = a.call("recv").get("op")
    return b"bad_frame" in answer and other == "ok", f"that connection closed (bad_frame); another answered {other}"


def _zombie_client(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, "--allocations", "required", sub="zombie")
    attacker = b.agent(d, cid=b.containers.new_id())
    with d.stopped():
        attacker.call("zombie_connect")  # the child connected and exited unreaped before the accept
    first = attacker.call("recv")
    d.stop()
    return refused_with(first, "identity")


def _zombie_admin(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub="zombie-admin")
    attacker = b.agent(d, cid=b.containers.new_id())
    put = {"sock": d.admin, "path": "/v1/tree/inst_ctl", "method": "PUT", "body": "create stolen weight=8 highprio=1"}
    after = attacker.call("admin_get", zombie=0.3, **put)  # a zombie once accepted
    with d.stopped():
        attacker.begin("admin_get", zombie=0.0, **put)  # a zombie before the accept
        time.sleep(0.5)
    before = attacker.result()
    made = "stolen" in d.ctl("cat", "inst_ctl").stdout
    d.stop()
    ok = after["status"] == before["status"] == 403 and not made
    return ok, f"{after['status']} and {before['status']}: {before['body'].strip()[:90]}"


def _slots(b: Battery) -> tuple[bool, str]:
    """At the defaults (1024 clients, 256 a container, 64 in reserve), under a soft descriptor limit of 1024."""
    limit = ("import os, resource, sys\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
             "os.execv(sys.argv[1], sys.argv[1:])\n")
    d = DaemonProc(b.tmp / "slots", *b.containers.daemon_args(), "--sim-gpus", GPUS,
                   wrap=[sys.executable, "-c", limit])
    b.daemons.append(d)
    d.start()
    held = [b.agent(d, cid=b.containers.new_id()).call("flood_connect", n=260)["open"] for _ in range(4)]
    fifth = b.agent(d, cid=b.containers.new_id()).register()
    root = d.ctl("cat", "0/policy")
    d.stop()
    ok = fifth.get("op") == "registered" and root.returncode == 0
    return ok, (f"held {'+'.join(map(str, held))} = {sum(held)}; the fifth {fifth.get('op')}, root's cgpuctl "
                f"{'answered' if root.returncode == 0 else 'refused: ' + root.stderr.strip()[:60]}")


def _admin_tcp(b: Battery) -> tuple[bool, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    d = b.daemon("--sim-gpus", GPUS, "--admin-listen", f"127.0.0.1:{port}", sub="admin-tcp")
    conns = []
    for _ in range(1006):
        try:
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=2))
        except OSError:
            break
    time.sleep(0.5)
    held = sum(still_open(c) for c in conns)
    root = d.ctl("cat", "0/policy").returncode == 0
    time.sleep(Config().admin_request_timeout_s + 1)
    left = sum(still_open(c) for c in conns)
    for c in conns:
        c.close()
    d.stop()
    return (held <= Config().max_admin_clients and left == 0 and root,
            f"{len(conns)} connected, {held} held (max_admin_clients {Config().max_admin_clients}), {left} left "
            f"after admin_request_timeout_s; root's cgpuctl {'answered' if root else 'refused'}")


def _greed(b: Battery) -> tuple[bool, str]:
    d = b.daemon("--sim-gpus", GPUS, sub="greed")
    victim = b.containers.new_id()
    assert d.ctl("echo", f"create {victim[:12]} weight=2", "inst_ctl").returncode == 0
    greedy = b.agent(d, cid=b.containers.new_id()).register(weight=14, highprio=1)
    nxt = b.agent(d, cid=b.containers.new_id()).register()
    d.stop()
    g = greedy["gpus"][0]
    return ((g["weight"], g["highprio"]) == (1, 0) and nxt.get("op") == "registered",
            f"registered at weight {g['weight']}, highprio {g['highprio']}; the next container {nxt.get('op')}")


def _handshake(b: Battery) -> tuple[bool, str]:
    from bench.containment import daemon as nvml_daemon
    from cgpu_testing.nvml import FakeNvml

    nvml = FakeNvml(b.tmp / "nvml.ctl")
    d = nvml_daemon(b.tmp / "handshake", nvml, b.containers, "--unmanaged", "kill", "--memory-enforce", "kill",
                    "--nvml-poll-ms", "100")
    b.daemons.append(d)
    assert d.ctl("echo", "1GiB", "default_memsize").returncode == 0
    knock = ("import socket, sys, time\n"
             "while True:\n"
             "    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.close(); time.sleep(10)\n")
    proc = subprocess.Popen([sys.executable, "-c", knock, d.sock])
    b.containers.place(proc.pid, b.containers.new_id())
    try:
        time.sleep(0.3)
        nvml.run(proc.pid, int(2.8 * (1 << 30)))
        t0 = time.monotonic()
        while proc.poll() is None and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        d.stop()
    return took < 10, f"killed {took:.2f} s after NVML showed it (2.8 GiB against 1 GiB)"


def share_phase(b: Battery, d: DaemonProc, victim: str, seconds: float) -> dict[str, Any]:
    """The victim alone, then beside the liar under the floods."""
    work = b.agent(d, cid=victim)
    probe = b.agent(d, cid=victim)
    assert work.register()["op"] == "registered" and probe.register()["op"] == "registered"
    print("the victim alone:", flush=True)
    alone: dict[str, Any] = {}
    t = threading.Thread(target=lambda: alone.update(work.call("work", seconds=seconds / 4)))
    t.start()
    rtt_alone = probe.call("probe", seconds=seconds / 4 - 0.5)["rtt_ms"]
    t.join()
    liar_id = b.containers.new_id()
    liar = b.agent(d, cid=liar_id)
    assert liar.register()["op"] == "registered"
    print(f"beside the liar, under the floods ({seconds:.0f} s):", flush=True)
    floods = Floods(b, d, seconds)
    floods.start()
    got: dict[str, dict[str, Any]] = {}
    workers = [threading.Thread(target=lambda n=n, a=a, kw=kw: got.__setitem__(n, a.call("work", seconds=seconds,
                                                                                        **kw)))
               for n, a, kw in (("victim", work, {}), ("liar", liar, LIE))]
    for w in workers:
        w.start()
    time.sleep(1.0)
    rtt = probe.call("probe", seconds=seconds - 2.0)["rtt_ms"]
    for w in workers:
        w.join()
    floods.finish()
    v, li = got["victim"]["ops"], got["liar"]["ops"]
    share, p99 = 100 * v / max(1, v + li), _pct(rtt, 99)
    b.record("flood requests from 20 connections", "host user", p99 <= 5.0,
             f"{floods.sent} requests in {seconds - 1:.0f} s, served in turns: the victim's round trip p99 "
             f"{p99:.2f} ms")
    costly = floods.results["bytes"]
    b.record("flood requests of 4 160 empty maps each (4.3 KiB) from 8 connections", "container",
             p99 <= 5.0 and costly["closed"] == 0,
             f"{costly['sent']} sent, each counted by its bytes in its tenant's turn: the victim's round trip p99 "
             f"{p99:.2f} ms")
    b.record("claim 90 ms of warm-up and 20 ms of transit on every lease", "container", share >= 49.0,
             f"the victim did {share:.2f} % of the work the two did (the liar gains at most 2 points)")
    return {"victim_ops": v, "liar_ops": li, "victim_share_pct": round(share, 2),
            "victim_ops_per_s": round(v / seconds, 1),
            "alone_ops_per_s": round(alone["ops"] / (seconds / 4), 1),
            "rtt_alone_p50_ms": round(_pct(rtt_alone, 50), 3), "rtt_alone_p99_ms": round(_pct(rtt_alone, 99), 3),
            "rtt_p50_ms": round(_pct(rtt, 50), 3), "rtt_p99_ms": round(_pct(rtt, 99), 3),
            "rtt_max_ms": round(max(rtt), 3), "probes": len(rtt)}


def _pct(xs: list[float], q: int) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q / 100 * (len(s) - 1)))]


class Floods:
    """The floods, on GPU 1, while the victim works on GPU 0."""

    def __init__(self, b: Battery, d: DaemonProc, seconds: float) -> None:
        self.b, self.d, self.seconds = b, d, seconds
        self.conns = b.agent(d, uid=NOBODY - 3)  # each flood from a uid of its own: a cap is per uid
        self.requests = b.agent(d, uid=NOBODY - 1)
        self.hog = b.agent(d, cid=b.containers.new_id())
        self.costly = b.agent(d, cid=b.containers.new_id())  # requests costly to decode, from a container
        self.idle = b.agent(d, uid=NOBODY - 2)
        self.threads: list[threading.Thread] = []
        self.sent = 0
        self.results: dict[str, dict[str, Any]] = {}

    def _run(self, name: str, agent: Agent, op: str, **kw: Any) -> None:
        self.results[name] = agent.call(op, **kw)

    def start(self) -> None:
        self.results["connections"] = self.conns.call("flood_connect", n=200)
        self.results["idle"] = self.idle.call("flood_connect", n=10)
        assert self.requests.call("flood_connect", n=20)["open"] == 20
        assert self.hog.call("flood_connect", n=1)["open"] == 1
        assert self.costly.call("flood_connect", n=8)["open"] == 8
        t = threading.Thread(target=self._run, args=("bytes", self.costly, "flood_bytes"),
                             kwargs={"seconds": self.seconds - 1, "conns": 8, "register": {"instance": None}})
        t.start()
        self.threads.append(t)
        for name, agent, kw in (
                ("requests", self.requests, {"seconds": self.seconds - 1, "conns": 20, "gpu": 1}),
                ("unread", self.hog, {"seconds": 5.0, "conns": 1, "gpu": 1, "read": False})):
            t = threading.Thread(target=self._run, args=(name, agent, "flood_requests"),
                                 kwargs={**kw, "register": {"instance": None}})
            t.start()
            self.threads.append(t)

    def finish(self) -> None:
        for t in self.threads:
            t.join()
        b, cfg = self.b, Config()
        c = self.results["connections"]
        b.record("open 200 connections", "host user", c["open"] == cfg.max_clients_per_uid and c["refused"] > 0,
                 f"{c['open']} open, {c['refused']} refused busy (max_clients_per_uid {cfg.max_clients_per_uid})")
        self.sent = self.results["requests"]["sent"]
        still = self.hog.call("count_open")["open"]
        b.record("never read its replies", "container", still == 0,
                 "its requests waited once 64 KiB of replies stood unread; closed, its buffer freed"
                 if still == 0 else "still open")
        wait_until = time.monotonic() + max(0.0, cfg.idle_timeout_s + 3 - self.seconds)
        while self.idle.call("count_open")["open"] and time.monotonic() < wait_until:
            time.sleep(0.5)
        left = self.idle.call("count_open")["open"]
        b.record("hold 10 greeted connections idle", "host user", left == 0,
                 f"{10 - left} closed after idle_timeout_s {cfg.idle_timeout_s:g}")


def state_phase(b: Battery, d: DaemonProc) -> tuple[bool, str]:
    """SIGKILL and a restart, then a bad record in the state file and a restart: everything an operator set."""
    before = [d.ctl("cat", p).stdout for p in ("inst_ctl", "0/policy", "0/max_inst")]
    d.stop(signal.SIGKILL)
    d.start()
    after_kill = [d.ctl("cat", p).stdout for p in ("inst_ctl", "0/policy", "0/max_inst")]
    d.stop()
    d.add_state_record({"id": "poison\n", "gpu": 0, "weight": 0, "highprio": 0, "memsize": 0, "provisioned": True})
    d.start()
    after_bad = [d.ctl("cat", p).stdout for p in ("inst_ctl", "0/policy", "0/max_inst")]
    kept = before == after_kill == after_bad and before[0] != ""
    return kept, "provisioning and GPU settings back after SIGKILL and after a bad record"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="also print the figures as one JSON document")
    p.add_argument("--seconds", type=float, default=40.0, help="the contended phase; the victim alone runs a "
                   "quarter of it (default 40: past idle_timeout_s)")
    p.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = p.parse_args(argv)
    if not IS_ROOT:
        print("bench.hostile: needs root, to run host attackers as nobody and put containers in cgroups")
        return 2
    cfg = Config()
    defaults = (f"policy {cfg.gpu.policy}, slice_ms auto, max_clients {cfg.max_clients}, max_clients_per_uid "
                f"{cfg.max_clients_per_uid}, max_clients_per_instance {cfg.max_clients_per_instance}, "
                f"max_records_per_uid {cfg.max_records_per_uid}, idle_timeout_s {cfg.idle_timeout_s:g}, "
                f"max_unread_bytes {cfg.max_unread_bytes}, overcommit {cfg.overcommit}, trust_client_env "
                f"{'on' if cfg.trust_client_env else 'off'} (client_env_max_weight {cfg.client_env_max_weight}, "
                f"client_env_highprio {'on' if cfg.client_env_highprio else 'off'}), client_reserve "
                f"{cfg.client_reserve}, max_admin_clients {cfg.max_admin_clients}, identity {cfg.identity}, "
                f"host_clients {cfg.host_clients}")
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-hostile-", dir="/tmp"))
    b = Battery(tmp)
    try:
        print(f"arbiterd at its defaults ({defaults}), --sim-gpus {GPUS}, client_mode 0666 "
              f"(containers: {'real cgroups' if b.containers.real else 'a fake /proc'})", flush=True)
        d = b.daemon("--sim-gpus", GPUS, "--client-mode", "0666", sub="main")
        victim = b.containers.new_id()
        for cmd in ("echo 2 0/policy", "echo 2 0/max_inst", f"echo create {victim[:12]} gpu=0 inst_ctl"):
            words = cmd.split(" ", 1)[1].rsplit(" ", 1)
            assert d.ctl("echo", words[0], words[1]).returncode == 0, cmd
        print(f"operator: 0/policy 2, 0/max_inst 2, inst_ctl create {victim[:12]} gpu=0", flush=True)
        one_shots(b, d, victim)
        figures = share_phase(b, d, victim, args.seconds)
        print("state:", flush=True)
        b.attempt("poison or lose the saved settings", "any", lambda: state_phase(b, d))
        kept = b.outcomes[-1].refused
        ok = sum(o.refused for o in b.outcomes)
        summary = (f"attacks={len(b.outcomes)} refused={ok} victim_share_pct={figures['victim_share_pct']:.2f} "
                   f"victim_rtt_p99_ms={figures['rtt_p99_ms']:.2f} state_kept={int(kept)}")
        rows = ["| attack | by | outcome |", "| --- | --- | --- |"]
        rows += [f"| {o.attack} | {o.by} | {'refused' if o.refused else '**not refused**'}: {o.how} |"
                 for o in b.outcomes]
        body = "\n".join([
            f"arbiterd at its defaults ({defaults}), `--sim-gpus {GPUS} --client-mode 0666`; containers in "
            f"{'real cgroups' if b.containers.real else 'a fake /proc'}, host attackers as nobody. GPU 0: policy 2, "
            "max_inst 2, the victim (weight 1) beside a container claiming 90 ms of warm-up and 20 ms of transit "
            f"on every lease; the floods on GPU 1. Contended phase {args.seconds:g} s, the victim alone "
            f"{args.seconds / 4:g} s before it.", "",
            *rows, "",
            "| victim | alone | beside the liar, under the floods | target |", "| --- | ---: | ---: | --- |",
            f"| share of the work done (%) | | {figures['victim_share_pct']:.2f} (ops {figures['victim_ops']} vs "
            f"{figures['liar_ops']}) | 50 +- 3 |",
            f"| ops per second (0.5 ms each, spun) | {figures['alone_ops_per_s']} | {figures['victim_ops_per_s']} "
            "| |",
            f"| round trip p50 (ms) | {figures['rtt_alone_p50_ms']:.2f} | {figures['rtt_p50_ms']:.2f} | |",
            f"| round trip p99 (ms) | {figures['rtt_alone_p99_ms']:.2f} | {figures['rtt_p99_ms']:.2f} | <= 5 |",
            f"| round trip max (ms) | | {figures['rtt_max_ms']:.2f} ({figures['probes']} probes) | |", "",
            summary])
        print()
        print(body)
        if args.json:
            print(json.dumps({**figures, "attacks": len(b.outcomes), "refused": ok, "state_kept": int(kept),
                              "outcomes": [o.__dict__ for o in b.outcomes]}))
        if not args.no_write:
            results.update("hostile", "python -m bench.hostile --json", body)
        return 0
    finally:
        b.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())

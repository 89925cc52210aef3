"""The daemon's lifecycle: sockets, the core's timer, persistence, systemd, shutdown.

Start-up order: discover GPUs, restore state, bind (or adopt) both sockets,
start serving, then ``READY=1``. Shutdown order: ``STOPPING=1``, stop
accepting, close client connections, save state, stop the admin API, remove
the socket files this process bound itself.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import grp
import itertools
import logging
import os
import secrets
import signal
import socket
import time
from collections import deque
from pathlib import Path
from typing import Any

from aiohttp import web

from arbiterd import __version__
from arbiterd.core import state as core_state
from arbiterd.core import tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig
from arbiterd.core.effects import NS_PER_S, Effect, Grant, Revoke
from arbiterd.core.errors import CoreError, NotFoundError
from arbiterd.core.scheduler import POLICY_NAMES
from arbiterd.core.units import parse_size
from arbiterd.server import config as config_mod
from arbiterd.server.config import Config
from arbiterd.server.connection import ClientConnection
from arbiterd.server.cpu import describe
from arbiterd.server.devices import discover
from arbiterd.server.identity import IdentityResolver
from arbiterd.server.persist import StateStore
from arbiterd.server.systemd import Notifier, listen_fds

log = logging.getLogger("arbiterd")
GRANT_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                         2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, float("inf"))
HISTORY = 61  # one sample a second: enough for the 60 s share window


class StartupError(Exception):
    """The daemon could not start (one-line reason)."""


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.gpus = discover(config.sim_gpus)
        now = time.monotonic_ns()
        self.arbiter = self._new_arbiter(now)
        self.store = StateStore(config.state_dir)
        self.state_problem: str | None = None
        self.identity = IdentityResolver(config.identity, config.proc_root)
        self.connections: dict[int, ClientConnection] = {}
        self._ids = itertools.count(1)
        self.notifier = Notifier()
        self.stats_bad_frames = 0
        self.grant_buckets = [0] * len(GRANT_LATENCY_BUCKETS)
        self.grant_latency_sum = 0.0
        self.grants_sent = 0
        self.revokes_sent = 0
        self.history: deque[tuple[int, dict[tuple[int, str], int], dict[int, int]]] = deque(maxlen=HISTORY)
        self.started_at = time.time()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._arm_pending = False
        self._servers: list[asyncio.AbstractServer] = []
        self._bound_paths: list[Path] = []
        self._admin_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._signals = 0
        self.admin_token: str | None = None
        self._restore_state(now)

    # ----------------------------------------------------------- set-up
    def _new_arbiter(self, now: int) -> Arbiter:
        cfg = self.config
        acfg = ArbiterConfig(trust_client_env=cfg.trust_client_env,
                             default_memsize=parse_size("default_memsize", str(cfg.default_memsize)),
                             linger_ns=cfg.linger_s * NS_PER_S)
        return Arbiter(self.gpus, acfg, {g.index: cfg.gpu_settings() for g in self.gpus}, now)

    def _restore_state(self, now: int) -> None:
        try:
            Path(self.config.state_dir).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.error("state dir %s cannot be created: %s", self.config.state_dir, exc.strerror)
        doc, problem = self.store.load()
        if doc is not None:
            try:
                for w in core_state.restore(self.arbiter, doc, now):
                    log.warning("%s", w)
                log.info("restored settings from %s", self.store.path)
            except CoreError as exc:
                self.arbiter = self._new_arbiter(now)
                problem = self.store.set_aside(str(exc))
        if problem:
            self.state_problem = problem
            log.error("STATE FILE PROBLEM: %s", problem)

    def new_client_id(self) -> int:
        return next(self._ids)

    def gpu_index(self, ref: int | str) -> int:
        if isinstance(ref, int):
            if ref in self.arbiter.scheds:
                return ref
        else:
            for g in self.gpus:
                if g.uuid == ref or (ref.isdigit() and int(ref) == g.index):
                    return g.index
        raise NotFoundError(f"no GPU {ref!r} on this host")

    # -------------------------------------------------------- effects & timer
    def apply(self, effects: list[Effect]) -> None:
        for eff in effects:
            conn = self.connections.get(eff.client)
            if conn is None:
                continue
            if isinstance(eff, Grant):
                conn.send({"op": "grant", "gpu": eff.gpu, "lease": eff.lease, "deadline_ns": eff.deadline_ns})
                self.grants_sent += 1
                secs = eff.waited_ns / 1e9
                self.grant_latency_sum += secs
                self.grant_buckets[bisect.bisect_left(GRANT_LATENCY_BUCKETS, secs)] += 1  # first bound >= secs
            elif isinstance(eff, Revoke):
                conn.send({"op": "revoke", "gpu": eff.gpu, "lease": eff.lease, "reason": eff.reason})
                self.revokes_sent += 1
                if eff.reason == "overrun":
                    log.warning("GPU %d client %d (pid %d): lease %d overran its deadline; revoked",
                                eff.gpu, conn.cid, conn.pid, eff.lease)
        if not self._arm_pending:  # once per loop iteration, however many messages it handled
            self._arm_pending = True
            asyncio.get_running_loop().call_soon(self._arm_timer)

    def _arm_timer(self) -> None:
        self._arm_pending = False
        at = self.arbiter.next_wakeup()
        if self._timer is not None and self._timer_at is not None and (at is None or at >= self._timer_at):
            # the armed timer comes first: keep it (a tick with nothing due only arms the next);
            # re-arming on every message costs more than the odd early tick
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at is not None:
            delay = max(0.0, (at - time.monotonic_ns()) / 1e9)
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.apply(self.arbiter.tick(time.monotonic_ns()))

    # ------------------------------------------------------------ admin ops
    def admin_write(self, path: str, value: str) -> None:
        """Apply an admin write only if the new state can be saved first; else change nothing."""
        now = time.monotonic_ns()
        trial = copy.deepcopy(self.arbiter)
        tree.write(trial, path, value, now)
        self.store.save(core_state.snapshot(trial))
        self.apply(tree.write(self.arbiter, path, value, now))
        log.info("admin: %s <- %s", path.strip("/"), value.strip())

    def save_state(self) -> None:
        try:
            self.store.save(core_state.snapshot(self.arbiter))
        except OSError as exc:
            log.error("state: could not save %s: %s", self.store.path, exc.strerror)

    # --------------------------------------------------------------- status
    def sample(self) -> None:
        now = time.monotonic_ns()
        held = {(g, n): self.arbiter.scheds[g].held_ns(n, now) for (g, n) in self.arbiter.records}
        busy = {g: s.busy_ns(now) for g, s in self.arbiter.scheds.items()}
        self.history.append((now, held, busy))

    def _past(self, now: int, age_ns: int) -> tuple[int, dict[tuple[int, str], int], dict[int, int]] | None:
        best = None
        for sample in self.history:
            if now - sample[0] >= age_ns:
                best = sample
        if best is None and self.history:
            best = self.history[0]
        return best

    def status(self) -> dict[str, Any]:
        now = time.monotonic_ns()
        arb = self.arbiter
        windows = {"1s": self._past(now, NS_PER_S), "60s": self._past(now, 60 * NS_PER_S)}
        gpus = []
        for g in self.gpus:
            sched = arb.scheds[g.index]
            s = sched.settings
            busy_now = sched.busy_ns(now)
            busy_pct: dict[str, float | None] = {}
            for key, past in windows.items():
                if past is None or now <= past[0]:
                    busy_pct[key] = None
                else:
                    busy_pct[key] = round(100 * (busy_now - past[2].get(g.index, 0)) / (now - past[0]), 2)
            insts = []
            for rec in arb.instances_on(g.index):
                st = sched.instances[rec.name]
                held = sched.held_ns(rec.name, now)
                share: dict[str, float | None] = {}
                for key, past in windows.items():
                    if past is None or now <= past[0]:
                        share[key] = None
                    else:
                        before = past[1].get((g.index, rec.name), 0)
                        share[key] = round(100 * (held - before) / (now - past[0]), 2)
                insts.append({
                    "id": rec.name, "weight": st.weight, "highprio": int(st.highprio),
                    "starved": st.weight == 0, "held_seconds": held / 1e9,
                    "share_pct": share, "grants": st.grants,
                    "mem_used": rec.ledger.used, "mem_limit": rec.ledger.limit,
                    "pids": sorted({self.arbiter.clients[c].pid for c in rec.clients if c in self.arbiter.clients}),
                    "clients": len(rec.clients), "provisioned": rec.provisioned,
                    "demand": sched.has_demand(rec.name),
                })
            gpus.append({
                "index": g.index, "name": g.name, "uuid": g.uuid, "simulated": g.simulated,
                "total_mem": g.total_mem, "mem_used": sum(r.ledger.used for r in arb.instances_on(g.index)),
                "policy": s.policy, "policy_name": POLICY_NAMES[s.policy], "max_inst": s.max_inst,
                "prio_ratio": s.prio_ratio, "slice_ms": s.slice_ms, "overrun_ms": s.overrun_ms,
                "free_weight": sched.free_weight, "busy_seconds": busy_now / 1e9, "busy_pct": busy_pct,
                "grants": sched.stats.grants, "revocations": sched.stats.revocations,
                "overruns": sched.stats.overruns, "instances": insts,
            })
        return {
            "version": __version__,
            "pid": os.getpid(),
            "uptime_seconds": round(time.time() - self.started_at, 3),
            "scheduling": describe(),
            "clients": len(self.connections),
            "state_file": str(self.store.path),
            "state_problem": self.state_problem,
            "upgrade": arb.upgrade,
            "gpus": gpus,
        }

    def status_line(self) -> str:
        n_inst = len(self.arbiter.records)
        return f"STATUS={len(self.gpus)} GPU(s), {n_inst} instance(s), {len(self.connections)} client(s)"

    # ------------------------------------------------------------ sockets
    def _bind_unix(self, path: Path, mode: int, group: str | None) -> socket.socket:
        if path.exists() or path.is_symlink():
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(str(path))
            except OSError:
                path.unlink()
            else:
                raise StartupError(f"{path} is in use: is another arbiterd running?")
            finally:
                probe.close()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        os.chmod(path, mode)
        if group is not None:
            try:
                os.chown(path, -1, grp.getgrnam(group).gr_gid)
            except (KeyError, OSError) as exc:
                sock.close()
                path.unlink(missing_ok=True)
                raise StartupError(f"cannot give {path} to group {group}: {exc}") from None
        sock.listen(1024)
        sock.setblocking(False)
        self._bound_paths.append(path)
        return sock

    async def start(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        # handlers first: a signal that arrives once the sockets accept must find them
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        run_dir = Path(cfg.run_dir)
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StartupError(f"run dir {run_dir}: {exc.strerror}") from None
        passed = listen_fds()
        try:
            client_sock = passed.get("arbiter") or self._bind_unix(
                run_dir / "arbiter.sock", cfg.client_mode, cfg.client_group)
            admin_sock = passed.get("admin") or self._bind_unix(
                run_dir / "admin.sock", cfg.admin_mode, cfg.admin_group)
        except OSError as exc:
            raise StartupError(f"cannot bind sockets in {run_dir}: {exc.strerror}") from None
        if passed:
            log.info("using %d socket(s) passed by the service manager: %s", len(passed), ", ".join(passed))
        server = await loop.create_unix_server(lambda: ClientConnection(self), sock=client_sock)
        self._servers.append(server)
        from arbiterd.server.admin import make_admin_app

        app = make_admin_app(self)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        self._admin_runner = runner
        await web.SockSite(runner, admin_sock).start()
        if cfg.admin_listen:
            host, _, port = cfg.admin_listen.rpartition(":")
            self.admin_token = self._load_token()
            await web.TCPSite(runner, host.strip("[]"), int(port)).start()
            log.info("admin API also on http://%s (bearer token in %s)", cfg.admin_listen,
                     Path(cfg.state_dir) / "admin.token")
        self.sample()
        self._tasks.append(asyncio.create_task(self._housekeeping()))
        if self.notifier.watchdog_usec:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        log.info("arbiterd %s serving %d GPU(s) on %s", __version__, len(self.gpus), run_dir / "arbiter.sock")
        self.notifier.send("READY=1", self.status_line(), f"MAINPID={os.getpid()}")

    def _load_token(self) -> str:
        path = Path(self.config.state_dir) / "admin.token"
        try:
            token = path.read_text().strip()
            if token:
                return token
        except FileNotFoundError:
            pass
        token = secrets.token_hex(32)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return token

    async def _housekeeping(self) -> None:
        cfg = self.config
        beat = 0
        while True:
            await asyncio.sleep(1.0)
            self.sample()
            now = time.monotonic()
            for conn in list(self.connections.values()):
                if not conn.greeted and now - conn.opened_at > cfg.handshake_timeout_s:
                    log.info("client %d (pid %d): no hello within %.1f s; closing", conn.cid, conn.pid,
                             cfg.handshake_timeout_s)
                    conn.fail("bad_request", "handshake timed out")
                elif conn.pending_partial() and now - conn.last_message_at > cfg.frame_timeout_s:
                    log.info("client %d (pid %d): partial frame for %.1f s; closing", conn.cid, conn.pid,
                             cfg.frame_timeout_s)
                    conn.fail("bad_frame", "frame timed out")
            beat += 1
            if beat % 5 == 0:
                self.notifier.send(self.status_line())

    async def _watchdog(self) -> None:
        period = self.notifier.watchdog_usec / 2e6
        while True:
            self.notifier.send("WATCHDOG=1")
            await asyncio.sleep(period)

    # ------------------------------------------------------------- reload
    def reload(self) -> bool:
        """Re-read the config file; apply what changed. A bad file changes nothing."""
        path = self.config.source
        if path is None:
            log.info("reload: no config file; nothing to do")
            return True
        self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            new = config_mod.load(path, {})
        except CoreError as exc:
            log.error("reload refused, keeping the running config: %s", exc)
            self.notifier.send("READY=1", "STATUS=reload refused: bad config")
            return False
        old = self.config
        now = time.monotonic_ns()
        for key in ("run_dir", "state_dir", "sim_gpus", "admin_listen", "client_mode", "admin_mode",
                    "client_group", "admin_group", "realtime_priority"):
            if getattr(new, key) != getattr(old, key):
                log.warning("reload: %s changed; it takes effect at the next restart", key)
                setattr(new, key, getattr(old, key))
        effects: list[Effect] = []
        for key in ("policy", "max_inst", "prio_ratio", "slice_ms", "overrun_ms"):
            if getattr(new, key) != getattr(old, key):
                for gpu, sched in self.arbiter.scheds.items():
                    try:
                        effects += getattr(sched, f"set_{key}")(getattr(new, key), now)
                    except CoreError as exc:
                        log.error("reload: GPU %d: %s", gpu, exc)
                log.info("reload: %s %s -> %s", key, getattr(old, key), getattr(new, key))
        acfg = self.arbiter.config
        acfg.trust_client_env = new.trust_client_env
        acfg.linger_ns = new.linger_s * NS_PER_S
        if new.default_memsize != old.default_memsize:
            self.arbiter.set_default_memsize(parse_size("default_memsize", str(new.default_memsize)))
        self.identity = IdentityResolver(new.identity, new.proc_root)
        logging.getLogger().setLevel(new.log_level.upper())
        new.source = path
        self.config = new
        self.apply(effects)
        log.info("reload: configuration re-read from %s", path)
        self.notifier.send("READY=1", self.status_line())
        return True

    # ----------------------------------------------------------- shutdown
    def request_stop(self, signame: str) -> None:
        self._signals += 1
        if self._signals > 1:
            log.warning("second %s: exiting at once", signame)
            os._exit(1)
        log.info("%s received: shutting down", signame)
        self._stop.set()

    async def serve_forever(self) -> None:
        await self._stop.wait()
        await self.stop()

    async def stop(self) -> None:
        self.notifier.send("STOPPING=1")
        for server in self._servers:
            server.close()
        for conn in list(self.connections.values()):
            conn.close()
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        self.save_state()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._timer is not None:
            self._timer.cancel()
        if self._admin_runner is not None:
            await asyncio.wait_for(self._admin_runner.cleanup(), 5.0)
        for path in self._bound_paths:
            path.unlink(missing_ok=True)
        self.notifier.close()
        log.info("arbiterd stopped")

"""The daemon's lifecycle: start-up, housekeeping, reload and shutdown.

Start-up order: discover GPUs, restore state, bind (or adopt) both sockets,
start serving, then ``READY=1``. Shutdown order: ``STOPPING=1``, stop
accepting, close client connections, save state, stop the admin API, remove
the socket files this process bound itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from arbiterd import __version__
from arbiterd.server import limits
from arbiterd.server import reload as reload_mod
from arbiterd.server import status as status_mod
from arbiterd.server.admin import ADMIN, METRICS, make_admin_app, make_metrics_app
from arbiterd.server.config import DEFAULT_CLIENT_MODE, DEFAULT_SOCKET_GROUP, Config
from arbiterd.server.connection import ClientConnection
from arbiterd.server.devices import discover
from arbiterd.server.hub import Hub
from arbiterd.server.nvml import ProcessSource, open_nvml
from arbiterd.server.persist import StateStore
from arbiterd.server.sockets import StartupError, bind_unix, group_id, load_token, secure_dir
from arbiterd.server.systemd import Notifier, listen_fds
from arbiterd.server.throttle import Throttle, thaw_left
from arbiterd.server.watch import Watcher

log = logging.getLogger("arbiterd")
__all__ = ["Daemon", "StartupError"]


def _gid(group: str | None, setting: str) -> int | None:
    if group is None:
        return None
    gid = group_id(group)
    if gid is None:
        raise StartupError(f"{setting}: there is no group {group}")
    return gid


def client_access(cfg: Config) -> tuple[int, int | None]:
    """The mode and group of arbiter.sock: 0660 and ``socket_group`` (by default ``cgpu``, where that group
    exists). Without a group only root may connect, unless the operator asks for a wider mode."""
    mode = cfg.client_mode if cfg.client_mode is not None else DEFAULT_CLIENT_MODE
    if cfg.socket_group is not None:
        return mode, _gid(cfg.socket_group, "socket_group")
    gid = group_id(DEFAULT_SOCKET_GROUP)
    if gid is None and cfg.client_mode is None:
        who = "root" if os.geteuid() == 0 else f"root and uid {os.geteuid()}"
        log.warning("arbiter.sock: there is no group %s, so only %s may connect (mode %04o); create the group "
                    "(systemd-sysusers cgpu.conf), or set socket_group, or ask for a wider client_mode",
                    DEFAULT_SOCKET_GROUP, who, mode)
    if mode & 0o006:
        log.warning("arbiter.sock: mode %04o lets every local user connect (client_mode)", mode)
    return mode, gid


class Daemon:
    def __init__(self, config: Config, flags: dict[str, Any] | None = None) -> None:
        self.flags = flags or {}
        short = limits.shortfall(config)
        if short is not None:
            raise StartupError(short)
        self.hub = Hub(config, discover(config.sim_gpus), StateStore(config.state_dir))
        self.notifier = Notifier()
        self._servers: list[asyncio.AbstractServer] = []
        self._bound_paths: list[Path] = []
        self._admin_runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._signals = 0
        self._source: ProcessSource | None = None
        secure_dir(Path(config.state_dir), 0o700, "state dir")
        self.hub.restore_state(time.monotonic_ns())

    def status(self) -> status_mod.DaemonStatus:
        return self.hub.status()

    def status_line(self) -> str:
        return f"STATUS={self.hub.summary()}"

    def _connection(self) -> ClientConnection:
        return ClientConnection(self.hub)

    # ------------------------------------------------------------ start
    async def start(self) -> None:
        cfg = self.hub.config
        loop = asyncio.get_running_loop()
        # handlers first: a signal that arrives once the sockets accept must find them
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, self.reload)
        run_dir = Path(cfg.run_dir)
        secure_dir(run_dir, 0o755, "run dir")
        # a token it must refuse stops the daemon before any socket accepts: no client may find it half started
        token = load_token(Path(cfg.state_dir) / "admin.token") if cfg.admin_listen else None
        passed = listen_fds()
        try:
            client_sock = passed.get("arbiter") or self._bind(run_dir / "arbiter.sock", *client_access(cfg))
            admin_sock = passed.get("admin") or self._bind(run_dir / "admin.sock", cfg.admin_mode,
                                                           _gid(cfg.admin_group, "admin_group"))
        except OSError as exc:
            raise StartupError(f"cannot bind sockets in {run_dir}: {exc.strerror}") from None
        if passed:
            log.info("using %d socket(s) passed by the service manager: %s", len(passed), ", ".join(passed))
        self._servers.append(await loop.create_unix_server(self._connection, sock=client_sock))
        app = make_admin_app(self.hub, token)
        # an admin request is a path, a token and at most 4 KiB of body: headers past these are refused (400)
        # before any token is checked, so a local user cannot make the daemon hold aiohttp's 1 MiB a request
        runner = web.AppRunner(app, access_log=None, handle_signals=False, max_line_size=2048, max_field_size=2048,
                               max_headers=32)
        await runner.setup()
        conns = app[ADMIN].conns
        assert runner.server is not None and conns is not None
        conns.install(runner.server)  # each admin.sock peer told at accept; connections capped and timed
        self._admin_runner = runner
        await web.SockSite(runner, admin_sock).start()
        if cfg.admin_listen:
            host, _, port = cfg.admin_listen.rpartition(":")
            await web.TCPSite(runner, host.strip("[]"), int(port)).start()
            log.info("admin API also on http://%s (bearer token in %s)", cfg.admin_listen,
                     Path(cfg.state_dir) / "admin.token")
        if cfg.metrics_listen:
            await self._serve_metrics(app, cfg.metrics_listen)
        self.hub.sample()
        self._tasks.append(asyncio.create_task(self._housekeeping()))
        self._start_watching()
        if self.notifier.watchdog_usec:
            self._tasks.append(asyncio.create_task(self._watchdog()))
        # what start-up made (imported modules, the admin app) lives as long as the daemon: out of the collector's
        # sight, a full collection walks only what serving makes, and pauses the clients no longer than that
        gc.freeze()
        log.info("arbiterd %s serving %d GPU(s) on %s", __version__, len(self.hub.gpus), run_dir / "arbiter.sock")
        self.notifier.send("READY=1", self.status_line(), f"MAINPID={os.getpid()}")

    async def _serve_metrics(self, admin_app: web.Application, where: str) -> None:
        """GET /metrics alone, with no token, on ``where`` (metrics_listen); a StartupError if it cannot bind."""
        app = make_metrics_app(admin_app)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        conns = app[METRICS].conns
        assert runner.server is not None and conns is not None
        conns.install(runner.server)
        self._metrics_runner = runner
        host, _, port = where.rpartition(":")
        try:
            await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        except OSError as exc:
            raise StartupError(f"metrics_listen: cannot listen on {where}: {exc.strerror}") from None
        log.info("metrics (GET /metrics, no token) on http://%s", where)

    def _bind(self, path: Path, mode: int, gid: int | None) -> Any:
        sock = bind_unix(path, mode, gid)
        self._bound_paths.append(path)
        return sock

    async def _housekeeping(self) -> None:
        beat = 0
        while True:
            await asyncio.sleep(1.0)
            self.hub.sample()
            self._drop_stalled()
            self.hub.recent.prune(time.monotonic_ns())  # per-pid bookkeeping is bounded by time, with or without NVML
            beat += 1
            if beat % 5 == 0:
                self.notifier.send(self.status_line())

    def _drop_stalled(self) -> None:
        cfg = self.hub.config
        now = time.monotonic_ns()
        for peer in list(self.hub.peers.values()):
            if not isinstance(peer, ClientConnection):
                continue
            quiet = self.hub.client_log.log
            if not peer.greeted and now - peer.opened_ns > cfg.handshake_timeout_s * 1e9:
                quiet(f"no hello {peer.peer.tenant}", logging.INFO, "client %d (pid %d): no hello within %.1f s; "
                      "closing", peer.cid, peer.pid, cfg.handshake_timeout_s)
                peer.fail("bad_request", "handshake timed out")
            elif peer.partial_for_ns(now) > cfg.frame_timeout_s * 1e9:
                quiet(f"partial {peer.peer.tenant}", logging.INFO, "client %d (pid %d): partial frame for %.1f s; "
                      "closing", peer.cid, peer.pid, cfg.frame_timeout_s)
                peer.fail("bad_frame", "frame timed out")
            elif peer.backed_up_for_ns(now) > cfg.frame_timeout_s * 1e9:
                peer.unread()  # its replies stood unread past UNREAD_MARK that long: closed, its buffer freed
            elif peer.idle_for_ns(now) > cfg.idle_timeout_s * 1e9:
                quiet(f"idle {peer.peer.tenant}", logging.INFO, "client %d (pid %d): said hello but did not "
                      "register within %.1f s; closing", peer.cid, peer.pid, cfg.idle_timeout_s)
                self.hub.counters.refused["idle"] += 1
                peer.fail("bad_request", "idle: register within idle_timeout_s of hello")

    def _start_watching(self) -> None:
        """Poll NVML for work that bypasses cgpu, on real GPUs (simulated ones have no processes to list). What a
        daemon before this one left frozen is thawed first, whether or not NVML opens."""
        record = Path(self.hub.config.run_dir) / "frozen"
        thaw_left(record)
        if any(g.simulated for g in self.hub.gpus):
            return
        source = open_nvml([g.index for g in self.hub.gpus])
        if source is not None:
            self._source = source
            watcher = self.hub.watch(source)
            watcher.throttle = Throttle(self.hub, asyncio.get_running_loop(), source.busy, record)
            self._tasks.append(asyncio.create_task(self._watch(watcher)))

    async def _watch(self, watcher: Watcher) -> None:
        gpus = [g.index for g in self.hub.gpus]
        while True:
            await asyncio.sleep(self.hub.config.nvml_poll_ms / 1000)
            try:
                watcher.poll(gpus)
            except Exception:  # one bad poll must not end the watching
                log.exception("NVML poll failed")

    async def _watchdog(self) -> None:
        period = self.notifier.watchdog_usec / 2e6
        while True:
            self.notifier.send("WATCHDOG=1")
            await asyncio.sleep(period)

    # ------------------------------------------------------------- reload
    def reload(self) -> bool:
        """Re-read the config file; apply what changed. A bad file changes nothing."""
        if self.hub.config.source is not None:
            self.notifier.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        ok = reload_mod.reload(self.hub, self.flags)
        if self.hub.config.source is not None:
            self.notifier.send("READY=1", self.status_line() if ok else "STATUS=reload refused: bad config")
        return ok

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
        for task in self._tasks:  # the NVML poll first: a poll after the throttle closed would freeze again
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.hub.watcher is not None and self.hub.watcher.throttle is not None:
            self.hub.watcher.throttle.close()  # nothing stays frozen once the daemon is gone
        for peer in list(self.hub.peers.values()):
            peer.close()
        for server in self._servers:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), 2.0)
        self.hub.save_state()
        self.hub.stop_timer()
        if self._source is not None:
            self._source.close()
        if self._admin_runner is not None:
            await asyncio.wait_for(self._admin_runner.cleanup(), 5.0)
        if self._metrics_runner is not None:
            await asyncio.wait_for(self._metrics_runner.cleanup(), 5.0)
        for path in self._bound_paths:
            path.unlink(missing_ok=True)
        self.notifier.close()
        log.info("arbiterd stopped")

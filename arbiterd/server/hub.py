"""The daemon's shared state: the core, the connected clients, and the one place effects become messages.

:class:`Hub` sits between the sans-I/O core and everything that talks: client
connections register as peers, the admin API writes through it, and every
:class:`~arbiterd.core.effects.Effect` the core returns goes out through
:meth:`Hub.apply`, which also keeps the core's timer armed. It imports none of
the modules that use it (connection, admin, metrics, daemon).
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import logging
import time
from typing import Protocol

from arbiterd.core import binding, tree
from arbiterd.core import state as core_state
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.effects import NS_PER_S, Effect
from arbiterd.core.effects import Grant as GrantEffect
from arbiterd.core.errors import NotFoundError
from arbiterd.server import tokens
from arbiterd.server.config import Config, default_memsize
from arbiterd.server.counters import Counters
from arbiterd.server.identity import Identity, IdentityResolver
from arbiterd.server.persist import StateStore
from libcgpu_client.protocol import Grant, Message, Revoke

log = logging.getLogger("arbiterd")


class Peer(Protocol):
    """A connected client, as the hub sees it."""

    cid: int
    pid: int

    def send(self, msg: Message) -> None: ...

    def close(self) -> None: ...


def new_arbiter(cfg: Config, gpus: list[GpuInfo], now: int) -> Arbiter:
    acfg = ArbiterConfig(trust_client_env=cfg.trust_client_env, default_memsize=default_memsize(cfg),
                         linger_ns=cfg.linger_s * NS_PER_S, allocations=cfg.allocations)
    return Arbiter(gpus, acfg, {g.index: cfg.gpu_settings() for g in gpus}, now)


class Hub:
    def __init__(self, config: Config, gpus: list[GpuInfo], store: StateStore) -> None:
        self.config = config
        self.gpus = gpus
        self.store = store
        self.arbiter = new_arbiter(config, gpus, time.monotonic_ns())
        self.identity = IdentityResolver(config.identity, config.proc_root)
        self.peers: dict[int, Peer] = {}
        self.counters = Counters()
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None

    # ----------------------------------------------------------- clients
    def attach(self, peer: Peer) -> int:
        cid = next(self._ids)
        self.peers[cid] = peer
        return cid

    def detach(self, cid: int) -> None:
        if self.peers.pop(cid, None) is not None:
            self.apply(self.arbiter.disconnect(cid, time.monotonic_ns()))

    def gpu_index(self, ref: int | str) -> int:
        """A GPU of this host by index or UUID."""
        if isinstance(ref, int):
            if ref in self.arbiter.scheds:
                return ref
        else:
            for g in self.gpus:
                if g.uuid == ref or (ref.isdigit() and int(ref) == g.index):
                    return g.index
        raise NotFoundError(f"no GPU {ref!r} on this host")

    # ----------------------------------------------------- effects & timer
    def apply(self, effects: list[Effect], gpu: int | None = None) -> None:
        """Send each effect to its client as a message, and keep the core's timer armed.

        ``gpu``: the one GPU whose scheduler the event touched (an acquire or a release), if that is all.
        """
        for eff in effects:
            peer = self.peers.get(eff.client)
            if peer is None:
                continue
            if isinstance(eff, GrantEffect):
                peer.send(Grant(eff.gpu, eff.lease, eff.deadline_ns))
                self.counters.granted(eff.waited_ns)
            else:
                peer.send(Revoke(eff.gpu, eff.lease, eff.reason))
                self.counters.revokes_sent += 1
                if eff.reason == "overrun":
                    log.warning("GPU %d client %d (pid %d): lease %d overran its deadline; revoked",
                                eff.gpu, peer.cid, peer.pid, eff.lease)
        self._arm_timer(gpu)

    def released(self, effects: list[Effect], gpu: int) -> None:
        """:meth:`apply`, after a release on ``gpu``. Under a concurrent policy (native) a release that granted
        nothing only ended a lease (base.Policy.concurrent): no deadline came earlier, so the timer is not looked
        at (the grant path's release: 0.3 us of a pair's 14 in bench.hotpath)."""
        if effects or not self.arbiter.scheds[gpu].policy.concurrent:
            self.apply(effects, gpu)

    def _arm_timer(self, gpu: int | None) -> None:
        """Keep the timer armed at or before the core's next wakeup (an early tick only arms the next).

        The armed timer is already at or before every GPU's wakeup as last asked, so after an event on
        one GPU only that GPU's wakeup is asked again, and the timer moves only if it came earlier:
        on the grant path that is one scheduler's check per message, not a timer per message.
        """
        at = self.arbiter.next_wakeup() if gpu is None else self.arbiter.scheds[gpu].next_wakeup()
        timer_at = self._timer_at
        if self._timer is not None and timer_at is not None and (at is None or at >= timer_at):
            return
        if gpu is not None and at is None:
            return  # nothing armed and nothing due on this GPU; the others had nothing either
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

    def stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # ------------------------------------------------------ allocations
    def bind(self, pid: int, ident: Identity) -> binding.Bound | None:
        """Bind the allocations whose tokens process ``pid`` holds (allocations on); None if none apply.

        Tried on a copy first, so a refusal changes nothing; a change is saved.
        """
        if self.arbiter.config.allocations == "off":
            return None
        mount = self.config.alloc_mount
        scan = tokens.scan(self.config.proc_root, pid, mount) if ident.container else tokens.TokenScan()
        for why in scan.skipped:
            log.warning("container %s (pid %d): allocation token not used: %s", ident.instance, pid, why)
        who = binding.Claimant(ident.instance, ident.container, ident.pod, frozenset(scan.digests), mount)
        now = time.monotonic_ns()
        binding.bind(copy.deepcopy(self.arbiter), who, now)
        bound = binding.bind(self.arbiter, who, now)
        if bound is not None and bound.changed:
            log.info("container %s (pid %d): bound allocation(s) %s on GPU %s", ident.instance, pid,
                     ", ".join(bound.allocations), ",".join(map(str, bound.gpus)))
            self.save_state()
            self.apply(bound.effects)
        return bound

    # ------------------------------------------------------------ admin
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

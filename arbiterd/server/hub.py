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
from collections import Counter
from typing import Any, Protocol, TypeVar

from arbiterd.core import binding, tree
from arbiterd.core import state as core_state
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.effects import NS_PER_S, Effect
from arbiterd.core.effects import Grant as GrantEffect
from arbiterd.core.errors import BusyError, IdentityError, NotFoundError
from arbiterd.server import identity, tokens
from arbiterd.server.config import Config, default_memsize
from arbiterd.server.counters import Counters
from arbiterd.server.identity import Identity, IdentityResolver
from arbiterd.server.intake import Intake
from arbiterd.server.lograte import LogRate
from arbiterd.server.persist import StateStore
from cgpu_protocol import Grant, Message, Revoke

log = logging.getLogger("arbiterd")
_K = TypeVar("_K")


def _drop(counter: Counter[_K], key: _K) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class Peer(Protocol):
    """A connected client, as the hub sees it."""

    cid: int
    pid: int
    peer: identity.Peer  # who it is, fixed when it connected
    instance: str | None  # set once it registered

    def send(self, msg: Message) -> None: ...

    def close(self) -> None: ...


def arbiter_config(cfg: Config) -> ArbiterConfig:
    """What the core takes from the daemon's config (also applied again on reload)."""
    return ArbiterConfig(trust_client_env=cfg.trust_client_env, default_memsize=default_memsize(cfg),
                         linger_ns=cfg.linger_s * NS_PER_S, allocations=cfg.allocations, overcommit=cfg.overcommit,
                         clients_shape_gpus=cfg.identity == "declared", max_records_per_uid=cfg.max_records_per_uid)


def new_arbiter(cfg: Config, gpus: list[GpuInfo], now: int) -> Arbiter:
    return Arbiter(gpus, arbiter_config(cfg), {g.index: cfg.gpu_settings() for g in gpus}, now)


class Hub:
    def __init__(self, config: Config, gpus: list[GpuInfo], store: StateStore) -> None:
        self.config = config
        self.gpus = gpus
        self.store = store
        self.arbiter = new_arbiter(config, gpus, time.monotonic_ns())
        self.identity = IdentityResolver(config.identity, config.proc_root, config.host_clients)
        self.peers: dict[int, Peer] = {}
        self.by_uid: Counter[int] = Counter()  # connections of host processes, by uid
        self.by_container: Counter[str] = Counter()  # connections of processes in containers, by container
        self.by_instance: Counter[str] = Counter()  # registered connections of host processes, by instance
        self.intake = Intake()
        self.client_log = LogRate(logging.getLogger("arbiterd.clients"))  # lines a client can cause, rate-bound
        self.stats_cache: tuple[int, dict[str, Any]] | None = None  # (when, status) that stats requests answer from
        self.counters = Counters()
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None

    # ----------------------------------------------------------- clients
    def attach(self, peer: Peer) -> int:
        cid = next(self._ids)
        self.peers[cid] = peer
        who = peer.peer
        if who.container is not None:
            self.by_container[who.container] += 1
        else:
            self.by_uid[who.uid] += 1
        return cid

    def detach(self, cid: int) -> None:
        peer = self.peers.pop(cid, None)
        if peer is not None:
            who = peer.peer
            if who.container is not None:
                _drop(self.by_container, who.container)
            else:
                _drop(self.by_uid, who.uid)
            if who.container is None and peer.instance is not None:
                _drop(self.by_instance, peer.instance)
            self.apply(self.arbiter.disconnect(cid, time.monotonic_ns()))

    def admit(self, who: identity.Peer) -> tuple[str, str] | None:
        """Why a new connection of ``who`` is refused, as (reason, one line); None: it is let in."""
        cfg = self.config
        if len(self.peers) >= cfg.max_clients:
            return "busy", f"too many clients: the daemon allows {cfg.max_clients}"
        if who.container is not None:
            n = self.by_container[who.container]
            if n >= cfg.max_clients_per_instance:
                return "instance", (f"container {who.tenant} holds {n} connections, and may hold "
                                    f"{cfg.max_clients_per_instance} (max_clients_per_instance)")
        elif who.uid != 0 and self.by_uid[who.uid] >= cfg.max_clients_per_uid:
            return "uid", (f"uid {who.uid} holds {self.by_uid[who.uid]} connections, and may hold "
                           f"{cfg.max_clients_per_uid} (max_clients_per_uid)")
        return None

    def admit_instance(self, who: identity.Peer, instance: str) -> None:
        """Raise BusyError if a host process's registration as ``instance`` would pass that instance's cap (a
        container's connections were counted when they connected)."""
        cap = self.config.max_clients_per_instance
        if who.container is None and self.by_instance[instance] >= cap:
            self.counters.refused["instance"] += 1
            raise BusyError(f"instance {instance} holds {self.by_instance[instance]} connections, and may hold "
                            f"{cap} (max_clients_per_instance)")

    def registered(self, peer: Peer) -> None:
        """``peer`` registered: a host process now counts against its instance's cap."""
        if peer.peer.container is None and peer.instance is not None:
            self.by_instance[peer.instance] += 1

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
        overran: dict[tuple[int, int], list[Peer]] | None = None
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
                    if overran is None:
                        overran = {}
                    overran.setdefault((eff.gpu, eff.lease), []).append(peer)
        if overran:
            self._log_overruns(overran)
        self._arm_timer(gpu)

    def _log_overruns(self, overran: dict[tuple[int, int], list[Peer]]) -> None:
        """One line a lease cut off, however many clients shared it (and one an instance every few seconds: the
        metrics count every one)."""
        for (gpu, lease), holders in overran.items():
            pids = sorted({h.pid for h in holders})
            shown = ",".join(map(str, pids[:3])) + (",..." if len(pids) > 3 else "")
            self.client_log.log(f"overrun {holders[0].instance}", logging.WARNING, "GPU %d: lease %d of instance %s "
                                "overran its deadline; revoked (%d client(s), pid %s)", gpu, lease,
                                holders[0].instance, len(holders), shown)

    def released(self, effects: list[Effect], gpu: int) -> None:
        """:meth:`apply`, after a release on ``gpu``. Under a concurrent policy (native) a release that granted
        nothing only ended a lease (base.Policy.concurrent): no deadline came earlier, so the timer is not looked
        at (the grant path's release: 0.3 us of a pair's 14 in bench.hotpath)."""
        if effects or self.arbiter.scheds[gpu].release_moves_timer():
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
    def bind(self, who: identity.Peer, ident: Identity) -> binding.Bound | None:
        """Bind the allocations whose tokens process ``who`` holds (allocations on); None if none apply.

        Tried on a copy first, so a refusal changes nothing; a change is saved.
        """
        if self.arbiter.config.allocations == "off":
            return None
        mount = self.config.alloc_mount
        pid = who.pid
        scan = tokens.scan(self.config.proc_root, pid, mount) if ident.container else tokens.TokenScan()
        if ident.container and not self.identity.still_there(who):
            raise IdentityError(f"pid {pid} exited before its allocation tokens could be read")
        if scan.skipped:
            self.client_log.log(f"tokens {ident.instance}", logging.WARNING, "container %s (pid %d): %d allocation "
                                "token(s) not used: %s", ident.instance, pid, len(scan.skipped),
                                "; ".join(scan.skipped[:3]) + ("; ..." if len(scan.skipped) > 3 else ""))
        claimant = binding.Claimant(ident.instance, ident.container, ident.pod, frozenset(scan.digests), mount)
        now = time.monotonic_ns()
        if self.arbiter.allocations.by_digest(claimant.digests):  # else bind changes nothing: no trial needed
            binding.bind(copy.deepcopy(self.arbiter), claimant, now)
        bound = binding.bind(self.arbiter, claimant, now)
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

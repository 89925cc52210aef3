"""The one door into the core: every request, admin write and read goes through :class:`Hub`.

The core (arbiterd/core) is plain code on a virtual clock. Around it the hub
keeps what the server shares: the connected clients and the caps on them, the
counters, the state file, the status history, and the timer that wakes the
core. A client's request comes in as a parsed message through
:meth:`Hub.handle`, which returns the replies for that client and the
:class:`~arbiterd.core.effects.Effect` list the core decided on;
:meth:`Hub.deliver` sends both, turning each effect into its wire message for
the peer it names, and keeps the core's timer armed. An admin write is checked
by the core before anything changes and applied only then
(:meth:`Hub.admin_write`). Status, metrics and the tree are read through
:meth:`Hub.status` and :meth:`Hub.read`. It imports none of the modules that use
it (connection, admin, metrics, daemon).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import cgpu_protocol as p
from arbiterd.core import binding, snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo
from arbiterd.core.containment import Containment
from arbiterd.core.effects import NS_PER_MS, NS_PER_S, Effect, GrantLease
from arbiterd.core.errors import BusyError, CoreError, IdentityError, NotFoundError
from arbiterd.core.settings import GPU, INSTANCE, MAX_INST_MAX, InstanceSettings
from arbiterd.server import identity, status, tokens
from arbiterd.server.config import Config, default_memsize
from arbiterd.server.counters import Counters
from arbiterd.server.identity import Identity, IdentityResolver
from arbiterd.server.intake import Intake
from arbiterd.server.lograte import LogRate
from arbiterd.server.nvml import ProcessSource
from arbiterd.server.persist import StateStore
from arbiterd.server.watch import Key, RecentClients, Watcher

log = logging.getLogger("arbiterd")
_K = TypeVar("_K")
STATS_MAX_AGE_NS = 100_000_000  # a client's stats are answered from a status at most this old
# what a client learns of a GPU: what it is and how it is set (every GPU setting), nothing that sums the other
# tenants' activity (memory in use, grants, busy time, free weight, allocations, measured hand-overs, the round)
STATS_GPU_FIELDS = frozenset({"index", "uuid", "name", "simulated", "total_mem", "policy_name", "slice_effective_ms",
                              *GPU})
NO_REPLY: tuple[p.Message, ...] = ()
NO_TIMER = -1  # an outcome that cannot move any deadline: the timer is not looked at
RESERVE_EACH = 4  # a tenant holding fewer connections than this may take one of the client_reserve slots
STATE_ROOM = 4096  # what one admin write may add to the state file, at most (tried before it is made)


# What a request comes to: the replies for its client, the core's effects, and the one GPU whose timer they may
# move (None: any; NO_TIMER: none). A plain tuple: one is built per request.
Outcome = tuple[Sequence[p.Message], list[Effect], int | None]


def _drop(counter: Counter[_K], key: _K) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]


class Peer(Protocol):
    """A connected client, as the hub sees it."""

    cid: int
    pid: int
    uid: int
    peer: identity.Peer  # who it is, fixed when it connected
    instance: str | None  # set once it registered

    def send(self, msg: p.Message) -> None: ...

    def close(self) -> None: ...


def arbiter_config(cfg: Config) -> ArbiterConfig:
    """What the core takes from the daemon's config (also applied again on reload)."""
    declared = cfg.identity == "declared"
    return ArbiterConfig(trust_client_env=cfg.trust_client_env, default_memsize=default_memsize(cfg),
                         linger_ns=cfg.linger_s * NS_PER_S, allocations=cfg.allocations, overcommit=cfg.overcommit,
                         clients_shape_gpus=declared, max_records_per_uid=cfg.max_records_per_uid,
                         # identity = declared (development hosts) trusts what a client says, its environment too
                         env_max_weight=MAX_INST_MAX if declared else cfg.client_env_max_weight,
                         env_highprio=declared or cfg.client_env_highprio, gang_window_ms=cfg.gang_window_ms)


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
        self.counters = Counters()
        self.history = status.History()
        self.started_at = time.time()
        self.state_problem: str | None = None  # what went wrong with the state file at start, if anything
        self._stats_doc: tuple[int, dict[str, Any]] | None = None  # (when, status) that stats requests answer from
        self._ids = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self.containment = Containment(time.monotonic_ns())  # NVML's view of what bypasses cgpu (server/watch.py)
        self.watcher: Watcher | None = None
        self.recent = RecentClients()  # who held a registered connection lately: managed, though it closed

    # ----------------------------------------------------------- clients
    def admit(self, who: identity.Peer) -> tuple[str, str] | None:
        """Why a new connection of ``who`` is refused, as (reason, one line); None: it is let in."""
        cfg = self.config
        held = self.by_container[who.container] if who.container is not None else self.by_uid[who.uid]
        if len(self.peers) >= cfg.max_clients:
            return "busy", f"too many clients: the daemon allows {cfg.max_clients}"
        reserve = min(cfg.client_reserve, cfg.max_clients // 2)
        if len(self.peers) >= cfg.max_clients - reserve and held >= RESERVE_EACH:
            return "busy", (f"too many clients: the shared connections are taken, and the last {reserve} of "
                            f"max_clients are kept for tenants holding fewer than {RESERVE_EACH}; {who.tenant} holds "
                            f"{held}")
        if who.container is not None:
            if held >= cfg.max_clients_per_instance:
                return "instance", (f"container {who.tenant} holds {held} connections, and may hold "
                                    f"{cfg.max_clients_per_instance} (max_clients_per_instance)")
        elif who.uid != 0 and held >= cfg.max_clients_per_uid:
            return "uid", (f"uid {who.uid} holds {held} connections, and may hold "
                           f"{cfg.max_clients_per_uid} (max_clients_per_uid)")
        return None

    def attach(self, peer: Peer) -> int:
        """A connection let in (:meth:`admit`): its client id."""
        cid = next(self._ids)
        self.peers[cid] = peer
        who = peer.peer
        if who.container is not None:
            self.by_container[who.container] += 1
        else:
            self.by_uid[who.uid] += 1
        self.arbiter.connect(cid, peer.pid, peer.uid)
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

    # ---------------------------------------------------------- requests
    def handle(self, client: Peer, msg: p.Message, now: int) -> Outcome:
        """What ``client``'s request ``msg``, arrived at ``now``, comes to. Raises a CoreError (refused: nothing
        changed) or a ProtocolError (not a request)."""
        handler = _REQUESTS.get(type(msg))
        if handler is None:
            raise p.ProtocolError("bad_request", f"{msg.OP} is not a request")
        return handler(self, client, msg, now)

    def serve(self, client: Peer, msg: p.Message, now: int) -> None:
        """:meth:`handle`, then :meth:`deliver`."""
        self.deliver(client, self.handle(client, msg, now))

    def deliver(self, client: Peer, outcome: Outcome) -> None:
        """Send ``client`` its replies, then every effect to its peer, and keep the timer armed."""
        replies, effects, gpu = outcome
        for reply in replies:
            client.send(reply)
        if effects or gpu != NO_TIMER:
            self.apply(effects, gpu)

    def _register(self, client: Peer, msg: p.Register, now: int) -> Outcome:
        if client.instance is not None:
            raise IdentityError(f"this connection is already registered as {client.instance}")
        arb = self.arbiter
        ident = self.identity.identify(client.peer, msg.instance, arb.host_owner)
        instance = ident.instance
        self._admit_instance(client.peer, instance)
        gpus = [self.gpu_index(g) for g in msg.gpus]
        requested = _requested(msg, gpus)
        bound = self._bind(client.peer, ident)
        notes: list[str] = []
        if bound is not None and sorted(set(gpus)) != bound.gpus:
            notes.append(f"GPU {','.join(map(str, bound.gpus))} from allocation {', '.join(bound.allocations)} "
                         f"(asked for GPU {','.join(map(str, gpus))})")
            gpus = bound.gpus
        counted = client.peer.uid if client.peer.container is None and client.peer.uid > 0 else None  # root: trusted
        reg, effects = arb.register(client.cid, instance, gpus, requested, time.monotonic_ns(),
                                    host_uid=ident.host_uid, creator_uid=counted)
        client.instance = instance
        if not getattr(client, "proxy", False):  # a throttle's proxy stands for an offender: it manages nothing
            # managed from now: it holds a registered connection (server/watch.py)
            self.recent.saw(client.pid, client.peer.started)
        if client.peer.container is None:  # a host process counts against its instance's cap from now on
            self.by_instance[instance] += 1
        for w in reg.warnings:
            self.client_log.log(f"warned {instance} {w[:60]}", logging.WARNING, "client %d (pid %d): %s",
                                client.cid, client.pid, w)
        reply = p.Registered(msg.id, reg.instance, [dataclasses.asdict(g) for g in reg.gpus], notes + reg.warnings)
        return (reply,), effects, None

    def _admit_instance(self, who: identity.Peer, instance: str) -> None:
        """Raise BusyError if a host process's registration as ``instance`` would pass that instance's cap (a
        container's connections were counted when they connected)."""
        cap = self.config.max_clients_per_instance
        if who.container is None and self.by_instance[instance] >= cap:
            self.counters.refused["instance"] += 1
            raise BusyError(f"instance {instance} holds {self.by_instance[instance]} connections, and may hold "
                            f"{cap} (max_clients_per_instance)")

    def _acquire(self, client: Peer, msg: p.Acquire, now: int) -> Outcome:
        # a gang's step on one GPU may move another's deadline: every GPU's timer is asked then
        effects = self.arbiter.acquire(client.cid, msg.gpu, now)
        return (NO_REPLY, effects, None if self.arbiter.gangs.crossing else msg.gpu)

    def _release(self, client: Peer, msg: p.Release, now: int) -> Outcome:
        arb = self.arbiter
        effects, _ = arb.release(client.cid, msg.gpu, msg.lease, now, again=msg.again, used_ns=msg.used_ns,
                                 warmup_ns=msg.warmup_ns, spin_ns=msg.spin_ns)
        replies = (p.Ok(msg.id),) if msg.id is not None else NO_REPLY
        # a release that granted nothing moves no deadline where every client holds its own lease (native)
        timer: int | None = msg.gpu if effects or arb.scheds[msg.gpu].release_moves_timer() else NO_TIMER
        if arb.gangs.crossing:  # a gang's step on one GPU may move another's deadline
            timer = None
        return (replies, effects, timer)

    def _mem_reserve(self, client: Peer, msg: p.MemReserve, now: int) -> Outcome:
        dec = self.arbiter.mem_reserve(client.cid, msg.gpu, msg.bytes)
        reply = p.Ok(msg.id, dec.used, dec.limit) if dec.ok else p.Denied(msg.id, dec.used, dec.limit, dec.reason)
        return ((reply,), [], NO_TIMER)

    def _mem_free(self, client: Peer, msg: p.MemFree, now: int) -> Outcome:
        dec = self.arbiter.mem_free(client.cid, msg.gpu, msg.bytes)
        return ((p.Ok(msg.id, dec.used, dec.limit),) if msg.id is not None else NO_REPLY, [], NO_TIMER)

    def _mem_query(self, client: Peer, msg: p.MemQuery, now: int) -> Outcome:
        dec = self.arbiter.mem_query(client.cid, msg.gpu)
        return ((p.Ok(msg.id, dec.used, dec.limit),), [], NO_TIMER)

    def _stats(self, client: Peer, msg: p.Stats, now: int) -> Outcome:
        """This client's GPUs, showing only its own instance (nothing of other tenants), from a status at most
        STATS_MAX_AGE_NS old: however many clients ask, the daemon builds it at most ten times a second."""
        info = self.arbiter.client(client.cid)
        cached = self._stats_doc
        if cached is None or now - cached[0] > STATS_MAX_AGE_NS:
            cached = self._stats_doc = (now, self.status().to_json())
        gpus = [{**{k: v for k, v in g.items() if k in STATS_GPU_FIELDS},
                 "instances": [i for i in g["instances"] if i["id"] == info.instance]}
                for g in cached[1]["gpus"] if g["index"] in info.gpus]
        return ((p.StatsReply(msg.id, gpus),), [], NO_TIMER)

    def gpu_index(self, ref: int | str) -> int:
        """A GPU of this host by index or UUID."""
        if isinstance(ref, int):
            if ref in self.arbiter.scheds:
                return ref
        else:
            number = int(ref) if ref.isascii() and ref.isdigit() and len(ref) <= 6 else None
            for g in self.gpus:
                if g.uuid == ref or number == g.index:
                    return g.index
            ref = ref if len(ref) <= 64 else f"{ref[:64]}... ({len(ref)} characters)"
        raise NotFoundError(f"no GPU {ref!r} on this host")

    def _bind(self, who: identity.Peer, ident: Identity) -> binding.Bound | None:
        """Bind the allocations whose tokens process ``who`` holds (allocations on); None if none apply. Checked
        by the core first, so a refusal changes nothing; a change is saved."""
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
        binding.check(self.arbiter, claimant)
        bound = binding.bind(self.arbiter, claimant, time.monotonic_ns())
        if bound is not None and bound.changed:
            log.info("container %s (pid %d): bound allocation(s) %s on GPU %s", ident.instance, pid,
                     ", ".join(bound.allocations), ",".join(map(str, bound.gpus)))
            self.save_state()
            self.apply(bound.effects)
        return bound

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
            if isinstance(eff, GrantLease):
                peer.send(p.Grant(eff.gpu, eff.lease, eff.deadline_ns))
                self.counters.granted(eff.waited_ns)
            else:
                peer.send(p.Revoke(eff.gpu, eff.lease, eff.reason))
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

    # ------------------------------------------------- admin, reads, state
    def read(self, path: str) -> str:
        """The settings tree's file or folder at ``path``, as text."""
        return tree.read(self.arbiter, path, time.monotonic_ns())

    def admin_write(self, path: str, value: str) -> None:
        """Write ``value`` to the tree's file at ``path``: checked by the core first (a CoreError, nothing
        changed), and applied only once the state directory takes a write of the state's size and room to grow
        (an OSError, nothing changed); then the new state is saved."""
        write = tree.plan(self.arbiter, path, value)
        self.store.check_writable(len(self.store.encode(snapshot.take(self.arbiter))) + STATE_ROOM)
        self.apply(write(time.monotonic_ns()))
        log.info("admin: %s <- %s", path.strip("/"), value.strip())
        self.save_state()

    def save_state(self) -> None:
        try:
            self.store.save(snapshot.take(self.arbiter))
        except OSError as exc:
            log.error("state: could not save %s: %s", self.store.path, exc.strerror)

    def restore_state(self, now: int) -> None:
        """Put back what the state file holds (each item checked; a bad one is skipped and the file kept beside
        it); a file that cannot be used at all is set aside and the defaults stay."""
        doc, problem = self.store.load()
        if doc is not None:
            try:
                skipped = snapshot.restore(self.arbiter, doc, now)
                for w in skipped:
                    log.error("%s", w)
                if skipped:  # the rest is in force; the file as it was is kept beside it
                    problem = self.store.keep_copy(f"{len(skipped)} item(s) failed their checks and were skipped")
                log.info("restored settings from %s", self.store.path)
            except CoreError as exc:
                self.arbiter = new_arbiter(self.config, self.gpus, now)
                problem = self.store.set_aside(str(exc))
        if problem:
            self.state_problem = problem
            log.error("STATE FILE PROBLEM: %s", problem)

    def status(self) -> status.DaemonStatus:
        """The whole status document, now."""
        doc = status.build(self.arbiter, self.gpus, self.history, clients=len(self.peers),
                           started_at=self.started_at, state_file=str(self.store.path),
                           state_problem=self.state_problem)
        now, w = time.monotonic_ns(), self.watcher
        labels = status.pod_labels(self.arbiter)
        for g in doc.gpus:
            status.add_containment(g, self.containment, now, w.utilization.get(g.index) if w else None,
                                   w.throttled(g.index) if w else set(), labels)
        doc.pod_labels = labels
        return doc

    def watch(self, source: ProcessSource) -> Watcher:
        """Watch the GPUs through ``source`` (NVML): work that bypasses cgpu is seen, charged and stopped."""
        def limit(gpu: int, inst: str) -> int:
            """Its record's memsize, else default_memsize, else the whole device (as for a client)."""
            rec = self.arbiter.records.get((gpu, inst))
            if rec is not None:
                return self.arbiter.mem_limit(rec)
            total, size = self.arbiter.gpus[gpu].total_mem, self.arbiter.globals.default_memsize
            return min(size, total) if size > 0 else total

        def managed(now: int) -> dict[Key, str | None]:
            """The managed processes: each registered client with its instance, then the recent connections."""
            out: dict[Key, str | None] = dict.fromkeys(self.recent.keys(now))
            out.update({(p.pid, p.peer.started): p.instance for p in self.peers.values()
                        if p.instance is not None and not getattr(p, "proxy", False)})
            return out

        self.watcher = Watcher(source, self.identity, self.containment, managed, limit,
                               lambda gpu: self.arbiter.scheds[gpu].settings, lambda: self.config.unmanaged_allow)
        return self.watcher

    def handover_meters(self) -> dict[int, tuple[list[int], int]]:
        """Each GPU's hand-over histogram: the count in each of accounting.BUCKETS, and the sum in ns."""
        return {g: (list(s.handover.buckets), s.handover.sum_ns) for g, s in self.arbiter.scheds.items()}

    def summary(self) -> str:
        """One line for systemd: GPUs, instances, clients."""
        return f"{len(self.gpus)} GPU(s), {len(self.arbiter.records)} instance(s), {len(self.peers)} client(s)"

    def sample(self) -> None:
        """One sample of every counter, for the shares over the last 1 s and 60 s."""
        self.history.sample(self.arbiter, time.monotonic_ns())

    def retune(self, old: Config, new: Config, now: int) -> None:
        """A reload: put in force the per-GPU defaults and the core's options that changed from ``old`` to
        ``new`` (a GPU that refuses a value keeps its own, with a log line)."""
        effects: list[Effect] = []
        for name, setting in GPU.items():
            before, after = getattr(old.gpu, name), getattr(new.gpu, name)
            if after == before:
                continue
            for gpu, sched in self.arbiter.scheds.items():
                try:
                    effects += sched.set(name, after, now)
                except CoreError as exc:
                    log.error("reload: GPU %d: %s", gpu, exc)
            log.info("reload: %s %s -> %s", name, setting.format(before), setting.format(after))
        acfg, fresh = self.arbiter.config, arbiter_config(new)
        for name in ("trust_client_env", "linger_ns", "allocations", "overcommit", "clients_shape_gpus",
                     "max_records_per_uid", "env_max_weight", "env_highprio"):
            setattr(acfg, name, getattr(fresh, name))
        if new.default_memsize != old.default_memsize:
            self.arbiter.set_global("default_memsize", default_memsize(new))
        if new.gang_window_ms != old.gang_window_ms:
            self.arbiter.gangs.set_window(new.gang_window_ms * NS_PER_MS, now)
            effects += self.arbiter.gangs.take()
            log.info("reload: gang_window_ms %d -> %d", old.gang_window_ms, new.gang_window_ms)
        self.identity = IdentityResolver(new.identity, new.proc_root, new.host_clients)
        self.config = new
        self.apply(effects)


def _requested(msg: p.Register, gpus: list[int]) -> dict[int, InstanceSettings]:
    """The settings a registration states, per GPU (its memsize list: one per GPU, the last repeating)."""
    memsize = msg.memsize or []
    out = {}
    for i, gpu in enumerate(gpus):
        values = {"weight": 1 if msg.weight is None else msg.weight,
                  "highprio": 0 if msg.highprio is None else msg.highprio,
                  "memsize": memsize[min(i, len(memsize) - 1)] if memsize else 0}
        if msg.core_percent is not None:
            values["core_percent"] = msg.core_percent
        if msg.limit is not None:
            values["limit"] = msg.limit
        out[gpu] = InstanceSettings(**{k: INSTANCE[k].check(v) for k, v in values.items()})
    return out


# each request's handler, by its message class: one lookup instead of a chain of isinstance tests per message
_REQUESTS: dict[type[p.Message], Callable[[Hub, Peer, Any, int], Outcome]] = {
    p.Acquire: Hub._acquire, p.Release: Hub._release, p.MemReserve: Hub._mem_reserve, p.MemFree: Hub._mem_free,
    p.MemQuery: Hub._mem_query, p.Register: Hub._register, p.Stats: Hub._stats,
}

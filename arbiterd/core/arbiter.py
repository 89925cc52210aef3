"""The node's arbiter: every GPU's scheduler, instance records, clients and memory.

An *instance record* is one container's settings on one GPU (weight, highprio,
memsize). It is **provisioned** through ``inst_ctl`` by a trusted party (a
runtime hook, a device plugin, an operator), or made **at the first
registration** of a client, from the settings it states, only while
``trust_client_env`` is on (else from the defaults), and within what the
environment may ask (``env_max_weight``, ``env_highprio``). Provisioned settings always
win; later clients of an instance join its record, so the client socket never
changes settings. A record without clients lingers ``linger_ns`` (a client that
reconnects after a restart finds its settings), then goes unless provisioned.
A GPU-core percentage is a weight (behaviour §3): the first on an unused GPU
still on policy 1 sets it to policy 3 with 20 slots, and a weight above 1 on
policy 1 sets it to policy 2, when a trusted party asks (``inst_ctl``, an
allocation; a client only while ``clients_shape_gpus``, i.e. ``identity =
declared``). Otherwise a client's settings shape its own record and nothing else.

When a GPU's ``free_weight`` is 0, a client's registration there is refused
(``overcommit = "refuse"``), or admitted at weight 0 and raised to the weight it
asked for as soon as that much is free (``overcommit = "queue"``).

Like the schedulers, the arbiter does no I/O: every call takes ``now`` and
returns effects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import NoReturn

from arbiterd.core import coremode, limits, shimspin
from arbiterd.core.allocations import AllocationBook
from arbiterd.core.effects import NS_PER_MS, NS_PER_S, Effect
from arbiterd.core.errors import BusyError, ConflictError, IdentityError, NotFoundError, SettingError
from arbiterd.core.gang import GangBook
from arbiterd.core.memory import MemDecision
from arbiterd.core.records import (
    OVERCOMMIT,
    Absent,
    ArbiterConfig,
    ClientInfo,
    GpuInfo,
    InstanceRecord,
    RegisteredGpu,
    Registration,
    from_environment,
)
from arbiterd.core.scheduler import GpuScheduler
from arbiterd.core.settings import (
    CORE_MAX_INST,
    GLOBAL,
    INSTANCE,
    NO_LIMIT,
    GlobalSettings,
    GpuSettings,
    InstanceSettings,
    limit_of,
)

log = logging.getLogger("arbiterd.core")


class Arbiter:
    """All GPUs of the node. The asyncio server is a thin shell around this."""

    def __init__(
        self,
        gpus: list[GpuInfo],
        config: ArbiterConfig | None = None,
        gpu_settings: dict[int, GpuSettings] | None = None,
        now: int = 0,
    ) -> None:
        self.config = config if config is not None else ArbiterConfig()
        self.gpus = {g.index: g for g in gpus}
        settings = gpu_settings or {}
        self.scheds = {
            g.index: GpuScheduler(g.index, settings.get(g.index, GpuSettings()), now) for g in gpus
        }
        self.gangs = GangBook(self.config.gang_window_ms * NS_PER_MS)
        for sched in self.scheds.values():
            self.gangs.attach(sched)
        self.records: dict[tuple[int, str], InstanceRecord] = {}
        self.clients: dict[int, ClientInfo] = {}
        self.globals = GlobalSettings(default_memsize=self.config.default_memsize)
        self.allocations = AllocationBook()
        self.absent = Absent()

    # ------------------------------------------------------------ lookups
    def sched(self, gpu: int) -> GpuScheduler:
        try:
            return self.scheds[gpu]
        except KeyError:
            raise NotFoundError(f"no GPU {gpu}") from None

    def record(self, gpu: int, name: str) -> InstanceRecord:
        try:
            return self.records[(gpu, name)]
        except KeyError:
            raise NotFoundError(f"no instance {name} on GPU {gpu}") from None

    def client(self, cid: int) -> ClientInfo:
        try:
            return self.clients[cid]
        except KeyError:
            raise NotFoundError(f"unknown client {cid}") from None

    def charge_outside(self, gpu: int, name: str, ns: int) -> None:
        """Bill instance ``name`` on ``gpu`` for ``ns`` of GPU time it used outside its leases (work an unmanaged
        process queued before it was frozen, as NVML measured it): counted as held and useful, and charged to its
        virtual time, so its next turns come that much later."""
        sched = self.scheds[gpu]
        inst = sched.instances.get(name)
        if inst is None or ns <= 0:
            return
        inst.held_ns += ns
        inst.useful_ns += ns
        sched.rq.bw.consume(inst, ns, 0)
        sched.rq.charge_vtime(inst, ns, sched.policy.vtime_weight(inst))
        sched.policy.after_charge(inst)

    def mem_limit(self, rec: InstanceRecord) -> int:
        total = self.gpus[rec.gpu].total_mem
        size = rec.memsize or self.globals.default_memsize
        return min(size, total) if size > 0 else total

    def instances_on(self, gpu: int) -> list[InstanceRecord]:
        return sorted(
            (r for (g, _), r in self.records.items() if g == gpu),
            key=lambda r: self.scheds[gpu].instances[r.name].order,
        )

    # ----------------------------------------------------- instance records
    def create_instance(
        self, gpu: int, name: str, s: InstanceSettings, now: int, *, provisioned: bool, shape_gpu: bool = True,
        host_uid: int | None = None, creator_uid: int | None = None,
    ) -> tuple[InstanceRecord, list[Effect], list[str]]:
        """Create the record of ``name`` on ``gpu``, clamping the weight to what is free.

        ``shape_gpu``: a core percentage or a weight may switch the GPU's policy (a trusted party asks)."""
        sched = self.sched(gpu)
        INSTANCE["memsize"].check(s.memsize)
        effects: list[Effect] = []
        warnings: list[str] = []
        if s.core_percent:
            effects, warnings = coremode.core_mode(sched, name, s.core_percent, s.limit, now, shape_gpu)
        weight = min(s.weight, sched.free_weight)
        if weight < s.weight:
            msg = (
                f"GPU {gpu} instance {name}: weight {s.weight} requested, more than is free; registered with "
                f"weight {weight}"
                + (" and it gets no GPU time until that much is free" if weight == 0 else "")
            )
            log.warning("%s", msg)
            warnings.append(msg)
        elif not shape_gpu and not s.core_percent and sched.policy.weight_switch(weight) is not None:
            msg = (f"GPU {gpu} instance {name}: weight {weight} has no effect under policy {sched.settings.policy}; "
                   f"an operator sets the policy")
            log.info("%s", msg)
            warnings.append(msg)
        limit = limit_of(s.limit)
        if limit < NO_LIMIT and not sched.policy.honours_limits:
            msg = (f"GPU {gpu} instance {name}: limit {limit} % is kept, and not in force under policy "
                   f"{sched.settings.policy} (limits hold on policies 1, 2 and 4)")
            log.info("%s", msg)
            warnings.append(msg)
        effects += sched.add_instance(name, weight, bool(s.highprio), now, requested=s.weight, switch=shape_gpu,
                                      limit=limit)
        rec = InstanceRecord(name, gpu, s.memsize, provisioned=provisioned, idle_since=now, host_uid=host_uid,
                             creator_uid=creator_uid)
        self.records[(gpu, name)] = rec
        rec.ledger.limit = self.mem_limit(rec)
        return rec, effects, warnings

    def provision(self, name: str, gpus: list[int], s: InstanceSettings, now: int, host_uid: int | None = None
                  ) -> list[Effect]:
        """``inst_ctl create``: trusted settings that win over a client's environment; ``host_uid``: the
        instance is for host processes of that uid (and no container may use it)."""
        return self.provision_each(name, dict.fromkeys(gpus, s), now, host_uid)

    def check_provision(self, name: str, settings: dict[int, InstanceSettings],
                        freed: Mapping[int, int] | None = None) -> None:
        """Raise a CoreError (one line) if ``name`` may not be provisioned so; change nothing. ``freed``: weight
        that other records give up on each GPU first."""
        for gpu, s in settings.items():
            sched = self.sched(gpu)
            core = bool(s.core_percent) and coremode.core_ready(sched)  # it becomes 20 slots first
            INSTANCE["weight"].check(s.weight, CORE_MAX_INST if core else sched.settings.max_inst)
            policy = coremode.core_policy(sched, s.core_percent, s.limit)
            limits.check_limit(sched.rq, name, s.weight, limit_of(s.limit), policy, CORE_MAX_INST if core else None)
            INSTANCE["highprio"].check(s.highprio)
            INSTANCE["memsize"].check(s.memsize)
            rec = self.records.get((gpu, name))
            room = (CORE_MAX_INST if core else sched.free_weight) + (sched.instances[name].weight if rec else 0)
            room += freed.get(gpu, 0) if freed else 0
            if s.weight > room:
                raise ConflictError(f"weight {s.weight} exceeds free_weight {room} on GPU {gpu}")

    def provision_each(self, name: str, settings: dict[int, InstanceSettings], now: int,
                       host_uid: int | None = None) -> list[Effect]:
        """Provision ``name`` with its own settings on each GPU: all of them, or (a CoreError) none."""
        self.check_provision(name, settings)
        effects: list[Effect] = []
        for gpu, s in settings.items():
            rec = self.records.get((gpu, name))
            if rec is None:
                _, eff, _ = self.create_instance(gpu, name, s, now, provisioned=True, host_uid=host_uid)
                effects += eff
            else:
                sched = self.scheds[gpu]
                if s.core_percent:
                    effects += coremode.core_mode(sched, name, s.core_percent, s.limit, now, True)[0]
                limit, want = sched.instances[name].limit, limit_of(s.limit)
                if limit != want:  # no limit first, so that the weight's check sees the new one
                    effects += sched.set_limit(name, NO_LIMIT, now)
                if sched.instances[name].weight != s.weight:
                    effects += sched.set_weight(name, s.weight, now)
                if limit != want:
                    effects += sched.set_limit(name, want, now)
                effects += sched.set_highprio(name, int(s.highprio), now)
                rec.memsize = s.memsize
                rec.ledger.limit = self.mem_limit(rec)
                rec.provisioned = True
                rec.host_uid = host_uid
                rec.creator_uid = None
        return effects

    def restore_record(self, gpu: int, name: str, weight: int, requested: int, highprio: int, memsize: int,
                       provisioned: bool, host_uid: int | None, creator_uid: int | None, now: int,
                       limit: int = NO_LIMIT) -> None:
        """Put back a saved record as it was (state.py has checked each value): its weight, 0 included, is
        not clamped and switches no policy."""
        sched = self.sched(gpu)
        if (gpu, name) in self.records:
            raise ConflictError(f"instance {name} is on GPU {gpu} twice")
        if weight > sched.free_weight:
            raise ConflictError(f"weight {weight} exceeds free_weight {sched.free_weight} on GPU {gpu}")
        sched.add_instance(name, weight, bool(highprio), now, requested=requested, switch=False, limit=limit)
        rec = InstanceRecord(name, gpu, memsize, provisioned=provisioned, idle_since=now, host_uid=host_uid,
                             creator_uid=creator_uid)
        self.records[(gpu, name)] = rec
        rec.ledger.limit = self.mem_limit(rec)

    def host_owner(self, name: str) -> int | None:
        """The host uid instance ``name`` is provisioned for, if any."""
        for (_, n), rec in self.records.items():
            if n == name and rec.host_uid is not None:
                return rec.host_uid
        return None

    def drop_records(self, name: str, gpus: list[int], now: int) -> list[Effect]:
        """Forget ``name`` on ``gpus``: at once where no client uses it, else when its last client leaves."""
        effects: list[Effect] = []
        for gpu in gpus:
            rec = self.records.get((gpu, name))
            if rec is None:
                continue
            if rec.clients:
                rec.provisioned = False
                continue
            effects += self.scheds[gpu].remove_instance(name, now)
            del self.records[(gpu, name)]
        return effects + self.promote(now)

    def check_unprovision(self, name: str, gpus: list[int] | None) -> list[InstanceRecord]:
        """The records ``inst_ctl remove`` would drop; a CoreError (one line) if it may not, changing nothing."""
        targets = [r for (g, n), r in self.records.items() if n == name and (gpus is None or g in gpus)]
        if not targets:
            raise NotFoundError(f"no instance {name}")
        busy = [r for r in targets if r.clients]
        if busy:
            raise ConflictError(f"instance {name} has {len(busy[0].clients)} connected client(s) on GPU {busy[0].gpu}")
        return targets

    def unprovision(self, name: str, gpus: list[int] | None, now: int) -> list[Effect]:
        """``inst_ctl remove``: drop the records of ``name`` (refused while clients use it)."""
        effects: list[Effect] = []
        for rec in self.check_unprovision(name, gpus):
            effects += self.scheds[rec.gpu].remove_instance(name, now)
            del self.records[(rec.gpu, name)]
        return effects + self.promote(now)

    def check_memsize(self, gpu: int, name: str, memsize: int) -> InstanceRecord:
        """The record of ``name`` on ``gpu``, if it may have ``memsize``; else a CoreError, changing nothing."""
        rec = self.record(gpu, name)
        INSTANCE["memsize"].check(memsize, self.gpus[gpu].total_mem)
        return rec

    def set_memsize(self, gpu: int, name: str, memsize: int) -> None:
        rec = self.check_memsize(gpu, name, memsize)
        rec.memsize = memsize
        rec.ledger.limit = self.mem_limit(rec)

    def set_global(self, name: str, value: object) -> None:
        """Set a node-wide setting (a key of :data:`arbiterd.core.settings.GLOBAL`)."""
        setattr(self.globals, name, GLOBAL[name].check(value))
        for rec in self.records.values():
            rec.ledger.limit = self.mem_limit(rec)

    # ------------------------------------------------------------- clients
    def connect(self, cid: int, pid: int, uid: int) -> None:
        self.clients[cid] = ClientInfo(cid, pid, uid)

    def register(
        self,
        cid: int,
        instance: str,
        gpus: list[int],
        requested: dict[int, InstanceSettings],
        now: int,
        host_uid: int | None = None,
        creator_uid: int | None = None,
    ) -> tuple[Registration, list[Effect]]:
        """Attach client ``cid`` to ``instance`` on ``gpus``; create records as needed: all, or (a CoreError)
        none. ``host_uid``: the client is a host process of that uid, whose records take the defaults;
        ``creator_uid``: the uid the records it makes count against (max_records_per_uid; None: uncounted)."""
        info = self.client(cid)
        if info.instance is not None:
            raise IdentityError(f"client {cid} is already registered as {info.instance}")
        if not gpus:
            raise SettingError("register: no GPU requested")
        for gpu in gpus:
            self.sched(gpu)
        self._admit(instance, list(dict.fromkeys(gpus)), host_uid, creator_uid)
        effects: list[Effect] = []
        warnings: list[str] = []
        out: list[RegisteredGpu] = []
        for gpu in dict.fromkeys(gpus):
            rec = self.records.get((gpu, instance))
            if rec is None:
                want = requested.get(gpu, InstanceSettings())
                if not self.config.trust_client_env or host_uid is not None:
                    want = InstanceSettings()
                else:
                    want, cut = from_environment(want, self.config, gpu, instance)
                    warnings += cut
                rec, eff, warn = self.create_instance(gpu, instance, want, now, provisioned=False,
                                                      shape_gpu=self.config.clients_shape_gpus,
                                                      creator_uid=creator_uid)
                effects += eff
                warnings += warn
                log.info("GPU %d instance %s: registered (weight %d)", gpu, instance,
                         self.scheds[gpu].instances[instance].weight)
            rec.clients.add(cid)
            rec.idle_since = None
            rec.ledger.pids[cid] = info.pid
            st = self.scheds[gpu].instances[instance]
            if st.weight == 0:
                warnings.append(f"GPU {gpu} instance {instance}: weight 0, no GPU time (free_weight was 0)")
            g = self.gpus[gpu]
            out.append(RegisteredGpu(gpu, g.uuid, g.name, st.weight, int(st.highprio), self.mem_limit(rec),
                                     g.total_mem))
        info.instance = instance
        info.gpus = tuple(dict.fromkeys(gpus))
        info.spin.since = now
        return Registration(instance, out, warnings), effects

    def _admit(self, instance: str, gpus: list[int], host_uid: int | None, creator_uid: int | None) -> None:
        """Refuse a registration that would need a record it may not have: before anything changes."""
        new = [g for g in gpus if (g, instance) not in self.records]
        for gpu in gpus:
            rec = self.records.get((gpu, instance))
            if rec is not None and rec.host_uid is not None and host_uid is not None and rec.host_uid != host_uid:
                raise IdentityError(f"instance {instance} is not yours: it is provisioned for another user")
        if self.config.overcommit == "refuse":
            for gpu in new:
                sched = self.scheds[gpu]
                if sched.free_weight == 0:
                    raise ConflictError(
                        f"GPU {gpu} has no free weight (max_inst {sched.settings.max_inst}, all of it taken): "
                        f"instance {instance} cannot register there; an operator can raise max_inst, lower a "
                        f"weight or remove an instance")
        cap = self.config.max_records_per_uid
        if creator_uid is not None and new and cap:
            made = sum(1 for r in self.records.values() if r.creator_uid == creator_uid)
            if made + len(new) > cap:
                raise BusyError(f"uid {creator_uid} has {made} instance records from its clients, and may have "
                                f"{cap} (max_records_per_uid)")

    def promote(self, now: int) -> list[Effect]:
        """``overcommit = "queue"``: raise each instance at weight 0 to the weight it asked for as soon as that
        much is free, in the order they came (one asking little may pass one asking more that does not fit yet)."""
        effects: list[Effect] = []
        if self.config.overcommit != "queue":
            return effects
        for sched in self.scheds.values():
            for inst in sorted(sched.instances.values(), key=lambda i: i.order):
                if inst.weight == 0 and 0 < inst.requested <= sched.free_weight:
                    want = min(inst.requested, sched.settings.max_inst)
                    log.info("GPU %d instance %s: weight %d is free now; raised from 0", sched.index, inst.name,
                             want)
                    effects += sched.set_weight(inst.name, want, now)
        return effects

    def _instance_on(self, cid: int, gpu: int) -> str:
        """The instance client ``cid`` registered on ``gpu`` (the grant path needs no more than its name)."""
        info = self.clients.get(cid)
        if info is None or info.instance is None or gpu not in info.gpus:
            self._refuse(cid, gpu)
        return info.instance

    def _refuse(self, cid: int, gpu: int) -> NoReturn:
        """Why client ``cid`` may not use ``gpu``."""
        info = self.clients.get(cid)
        if info is None:
            raise NotFoundError(f"unknown client {cid}")
        if info.instance is None:
            raise IdentityError("register first")
        raise IdentityError(f"client is not registered on GPU {gpu}")

    def _registered(self, cid: int, gpu: int) -> InstanceRecord:
        return self.record(gpu, self._instance_on(cid, gpu))

    # acquire and release test the registration inline, as _instance_on does: they are the grant path
    def acquire(self, cid: int, gpu: int, now: int) -> list[Effect]:
        info = self.clients.get(cid)
        if info is None or info.instance is None or gpu not in info.gpus:
            self._refuse(cid, gpu)
        return self.scheds[gpu].acquire(info.instance, cid, now)

    def release(
        self, cid: int, gpu: int, lease: int, now: int, again: bool = False, used_ns: int | None = None,
        warmup_ns: int | None = None, spin_ns: int | None = None,
    ) -> tuple[list[Effect], bool]:
        """``cid`` gives ``lease`` back on ``gpu`` (GpuScheduler.release); ``spin_ns``, the collective spin it counted
        there since its last release, is added to its instance's count there, whatever became of the lease."""
        info = self.clients.get(cid)
        if info is None or info.instance is None or gpu not in info.gpus:
            self._refuse(cid, gpu)
        if spin_ns:
            shimspin.check(spin_ns)
        out = self.scheds[gpu].release(cid, lease, now, again, used_ns, warmup_ns)
        if spin_ns:
            self._count_spin(info, gpu, spin_ns, now)
        return out

    def _count_spin(self, info: ClientInfo, gpu: int, spin_ns: int, now: int) -> None:
        rec = self.records.get((gpu, info.instance or ""))
        kept = shimspin.accept(info.spin, gpu, spin_ns, now)
        if rec is not None:
            rec.shim_spin_ns += kept
        if kept < spin_ns and not info.spin.cut:
            info.spin.cut = True
            log.warning("GPU %d instance %s: pid %d reported %.3f s of collective spin, more than the %.3f s since it "
                        "registered allows; %.3f s counted (said once per client)", gpu, info.instance, info.pid,
                        spin_ns / NS_PER_S, (now - info.spin.since) / NS_PER_S, kept / NS_PER_S)

    def mem_reserve(self, cid: int, gpu: int, nbytes: int) -> MemDecision:
        rec = self._registered(cid, gpu)
        return rec.ledger.reserve(cid, self.clients[cid].pid, nbytes)

    def mem_query(self, cid: int, gpu: int) -> MemDecision:
        ledger = self._registered(cid, gpu).ledger
        return MemDecision(True, ledger.used, ledger.limit)

    def mem_free(self, cid: int, gpu: int, nbytes: int) -> MemDecision:
        rec = self._registered(cid, gpu)
        return rec.ledger.free_bytes(cid, nbytes)

    def disconnect(self, cid: int, now: int) -> list[Effect]:
        """A client went away: its leases end at once and its memory returns."""
        info = self.clients.pop(cid, None)
        if info is None or info.instance is None:
            return []
        effects: list[Effect] = []
        for gpu in info.gpus:
            effects += self.scheds[gpu].drop_client(cid, now)
            rec = self.records.get((gpu, info.instance))
            if rec is None:
                continue
            freed = rec.ledger.drop_client(cid)
            rec.clients.discard(cid)
            if freed:
                log.info("GPU %d instance %s: %d bytes returned by pid %d", gpu, rec.name, freed, info.pid)
            if not rec.clients:
                rec.idle_since = now
        return effects

    # --------------------------------------------------------------- time
    def tick(self, now: int) -> list[Effect]:
        effects: list[Effect] = []
        dropped = False
        for sched in self.scheds.values():
            wake = sched.next_wakeup()
            if wake is not None and wake <= now:
                effects += sched.tick(now)
        for (gpu, name), rec in list(self.records.items()):
            if rec.idle_since is not None and not rec.provisioned and now - rec.idle_since >= self.config.linger_ns:
                log.info("GPU %d instance %s: no clients for %d s, record dropped", gpu, name,
                         self.config.linger_ns // NS_PER_S)
                effects += self.scheds[gpu].remove_instance(name, now)
                del self.records[(gpu, name)]
                dropped = True
        return effects + self.promote(now) if dropped else effects

    def next_wakeup(self) -> int | None:
        """The earliest time :meth:`tick` has something to do (asked after every burst of messages)."""
        best: int | None = None
        for sched in self.scheds.values():
            t = sched.next_wakeup()
            if t is not None and (best is None or t < best):
                best = t
        for r in self.records.values():
            if r.idle_since is not None and not r.provisioned:
                t = r.idle_since + self.config.linger_ns
                if best is None or t < best:
                    best = t
        return best


__all__ = ["OVERCOMMIT", "Absent", "Arbiter", "ArbiterConfig", "ClientInfo", "GpuInfo", "InstanceRecord",
           "RegisteredGpu", "Registration"]

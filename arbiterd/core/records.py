"""What the arbiter keeps besides the schedulers: the GPUs, instance records, clients, and its configuration."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from arbiterd.core.effects import NS_PER_S
from arbiterd.core.memory import MemoryLedger
from arbiterd.core.podlabels import PodLabels
from arbiterd.core.settings import MAX_INST_MAX, InstanceSettings
from arbiterd.core.shimspin import SpinTally


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    total_mem: int
    simulated: bool = False
    driver_version: str = ""  # NVML's; empty for a simulated GPU
    compute_capability: str = ""  # "8.6"; empty for a simulated GPU


@dataclass(slots=True)
class InstanceRecord:
    name: str
    gpu: int
    memsize: int
    provisioned: bool = False
    host_uid: int | None = None  # provisioned for host processes of this uid (inst_ctl create NAME uid=N)
    creator_uid: int | None = None  # made at the request of a host process of this uid (max_records_per_uid)
    clients: set[int] = field(default_factory=set)
    idle_since: int | None = None
    ledger: MemoryLedger = field(default_factory=lambda: MemoryLedger(0))
    labels: PodLabels | None = None  # its pod, from the allocations bound to it (binding.relabel); None: not a pod's
    shim_spin_ns: int = 0  # collective spin its clients reported on this GPU (shimspin.py)


@dataclass(slots=True)
class ClientInfo:
    cid: int
    pid: int
    uid: int
    instance: str | None = None
    gpus: tuple[int, ...] = ()
    spin: SpinTally = field(default_factory=SpinTally)  # its collective spin reports (shimspin.py)


@dataclass(frozen=True, slots=True)
class RegisteredGpu:
    """What a client learns of one GPU it registered on."""

    gpu: int
    uuid: str
    name: str
    weight: int
    highprio: int
    mem_limit: int
    total_mem: int


@dataclass(frozen=True, slots=True)
class Registration:
    instance: str
    gpus: list[RegisteredGpu]
    warnings: list[str]


@dataclass(slots=True)
class ArbiterConfig:
    trust_client_env: bool = True
    default_memsize: int = 0  # the initial value of the node-wide setting
    linger_ns: int = 60 * NS_PER_S
    allocations: str = "off"  # off | optional | required: see arbiterd.core.binding
    overcommit: str = "refuse"  # refuse | queue: a registration where free_weight is 0
    clients_shape_gpus: bool = False  # a client's weight or core percentage may switch a GPU's policy
    max_records_per_uid: int = 64  # records host processes of one uid may have made (0: no cap)
    # what a container's environment may ask for its own record (the daemon passes its config's; here: no cap)
    env_max_weight: int = MAX_INST_MAX
    env_highprio: bool = True
    # a job busy on several GPUs within this window is a gang, given its turns on all of them at once (gang.py);
    # 0: gangs off
    gang_window_ms: int = 200


def from_environment(want: InstanceSettings, cfg: ArbiterConfig, gpu: int, name: str) -> tuple[InstanceSettings,
                                                                                                list[str]]:
    """What a container's own environment may have of ``want`` for its record of ``name`` on ``gpu``: a weight (or
    a core percentage, weight P/5) of at most ``env_max_weight``, and high priority only where ``env_highprio``;
    with a warning for what was cut. Memory limits are its own to state."""
    notes: list[str] = []
    out = dataclasses.replace(want)
    cap = cfg.env_max_weight
    if out.core_percent and out.weight > cap:
        notes.append(f"GPU {gpu} instance {name}: core {out.core_percent} % asked by the container's environment; "
                     f"it may ask for at most {cap * 5} % (client_env_max_weight {cap}); an operator grants more")
        out = dataclasses.replace(out, core_percent=cap * 5)
    elif not out.core_percent and out.weight > cap:
        notes.append(f"GPU {gpu} instance {name}: weight {out.weight} asked by the container's environment; it may "
                     f"ask for at most {cap} (client_env_max_weight); an operator grants more")
        out.weight = cap
    if out.highprio and not cfg.env_highprio:
        notes.append(f"GPU {gpu} instance {name}: high priority asked by the container's environment; only an "
                     f"operator or an allocation grants it (client_env_highprio off)")
        out.highprio = 0
    return out, notes


OVERCOMMIT = ("refuse", "queue")


@dataclass(slots=True)
class Absent:
    """Items of the state file for GPUs this host does not have now, kept as they were (state.py)."""

    gpus: dict[str, Any] = field(default_factory=dict)
    instances: list[Any] = field(default_factory=list)
    allocations: list[Any] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.gpus or self.instances or self.allocations)

    def gpu_names(self) -> set[str]:
        names = set(self.gpus)
        names.update(str(i.get("gpu")) for i in self.instances if isinstance(i, dict))
        for a in self.allocations:
            if isinstance(a, dict) and isinstance(a.get("gpus"), list):
                names.update(str(g) for g in a["gpus"])
        return names

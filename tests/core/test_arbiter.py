"""The arbiter: registration precedence, weight 0, memory ledger, lingering records."""

from __future__ import annotations

import pytest

from arbiterd.core import snapshot
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo, InstanceSettings, RegisteredGpu
from arbiterd.core.effects import NS_PER_S, GrantLease
from arbiterd.core.errors import BusyError, ConflictError, CoreError, IdentityError, SettingError
from arbiterd.core.settings import GpuSettings

GIB = 1024**3


def make(trust: bool = True, max_inst: int = 4, shape: bool = False, overcommit: str = "refuse") -> Arbiter:
    """Two GPUs; ``shape``: clients may switch a GPU's policy (identity = declared)."""
    gpus = [GpuInfo(0, "sim", "GPU-a", 16 * GIB, True), GpuInfo(1, "sim", "GPU-b", 8 * GIB, True)]
    return Arbiter(gpus, ArbiterConfig(trust_client_env=trust, linger_ns=10 * NS_PER_S, clients_shape_gpus=shape,
                                       overcommit=overcommit),
                   {0: GpuSettings(max_inst=max_inst), 1: GpuSettings(max_inst=max_inst)})


def reg(arb: Arbiter, cid: int, name: str, weight: int = 1, mem: int = 0, gpus: list[int] | None = None,
        now: int = 0) -> dict[str, object]:
    arb.connect(cid, 1000 + cid, 0)
    gpus = gpus or [0]
    r, _ = arb.register(cid, name, gpus, {g: InstanceSettings(weight, False, mem) for g in gpus}, now)
    return r.gpus[0]


def test_client_env_sets_settings_of_a_new_instance() -> None:
    arb = make()
    info = reg(arb, 1, "a", weight=2, mem=GIB)
    assert info.weight == 2 and info.mem_limit == GIB


def test_provisioned_settings_win_over_client_env() -> None:
    arb = make()
    arb.provision("a", [0], InstanceSettings(3, False, 2 * GIB), 0)
    info = reg(arb, 1, "a", weight=1, mem=GIB)
    assert info.weight == 3 and info.mem_limit == 2 * GIB


def test_later_clients_cannot_change_settings_of_an_existing_instance() -> None:
    arb = make()
    reg(arb, 1, "a", weight=1)
    info = reg(arb, 2, "a", weight=3, mem=GIB)
    assert info.weight == 1 and info.mem_limit == 16 * GIB


def test_untrusted_env_is_ignored() -> None:
    arb = make(trust=False)
    info = reg(arb, 1, "a", weight=3, mem=GIB)
    assert info.weight == 1 and info.mem_limit == 16 * GIB


def test_a_registration_where_no_weight_is_free_is_refused_and_changes_nothing() -> None:
    """overcommit = refuse (the default): a clear refusal, never a silent weight 0, and on no GPU at all."""
    arb = make(max_inst=2)
    reg(arb, 1, "a", weight=2)
    before = snapshot.take(arb)
    arb.connect(2, 2000, 0)
    with pytest.raises(ConflictError, match="GPU 0 has no free weight"):
        arb.register(2, "b", [1, 0], {0: InstanceSettings(1), 1: InstanceSettings(1)}, 0)
    assert snapshot.take(arb) == before and arb.clients[2].instance is None


def test_queued_overcommit_admits_at_weight_zero_and_raises_it_when_weight_is_freed() -> None:
    """overcommit = queue: weight 0 with a warning (it gets no GPU time) until what it asked for is free."""
    arb = make(max_inst=2, overcommit="queue")
    reg(arb, 1, "a", weight=2)
    arb.connect(2, 2000, 0)
    r, _ = arb.register(2, "b", [0], {0: InstanceSettings(1)}, 0)
    assert r.gpus[0].weight == 0
    assert any("no GPU time" in w for w in r.warnings)
    assert arb.acquire(2, 0, 0) == []  # not granted while it waits
    from arbiterd.core import tree

    tree.write(arb, "0/a/weight", "1", 0)
    assert arb.scheds[0].instances["b"].weight == 1


def test_a_client_cannot_switch_a_gpu_by_its_weight_or_core_percentage() -> None:
    """identity = cgroup: a weight above 1 leaves policy 1 as it is, and a core percentage sets neither the
    policy nor max_inst; the client is told."""
    arb = make(max_inst=16)
    info = reg(arb, 1, "a", weight=3)
    assert info.weight == 3 and arb.scheds[0].settings.policy == 1
    info, warnings = reg_core(arb, 2, "b", 30, gpu=1)
    st = arb.scheds[1].settings
    assert (info.weight, st.policy, st.max_inst) == (6, 1, 16)
    assert len(warnings) == 1 and "an operator sets the policy" in warnings[0]


def test_a_host_uid_makes_its_records_from_the_defaults_and_up_to_its_cap() -> None:
    arb = make()
    arb.config.max_records_per_uid = 1
    arb.connect(1, 1001, 1000)
    r, _ = arb.register(1, "uid-1000", [0], {0: InstanceSettings(3, True, GIB)}, 0, host_uid=1000, creator_uid=1000)
    assert (r.gpus[0].weight, r.gpus[0].highprio, r.gpus[0].mem_limit) == (1, 0, 16 * GIB)
    arb.connect(2, 1002, 1000)
    with pytest.raises(BusyError, match="max_records_per_uid"):
        arb.register(2, "uid-1000", [1], {}, 0, host_uid=1000, creator_uid=1000)
    arb.connect(3, 1003, 1001)
    arb.register(3, "uid-1001", [1], {}, 0, host_uid=1001, creator_uid=1001)  # another uid has its own cap


def test_register_twice_is_refused() -> None:
    arb = make()
    reg(arb, 1, "a")
    with pytest.raises(IdentityError):
        arb.register(1, "b", [0], {}, 0)


def test_memory_is_shared_by_an_instances_processes_and_returned_on_exit() -> None:
    arb = make()
    reg(arb, 1, "a", mem=GIB)
    reg(arb, 2, "a")
    mib600 = 600 * 1024**2
    assert arb.mem_reserve(1, 0, mib600).ok
    denied = arb.mem_reserve(2, 0, mib600)
    assert not denied.ok and "out of memory" in denied.reason
    rec = arb.record(0, "a")
    assert rec.ledger.meminfo() == f"Free: {GIB - mib600}\nPID: 1001 Mem: {mib600}\n"
    arb.disconnect(1, 1)
    assert rec.ledger.used == 0
    assert arb.mem_reserve(2, 0, mib600).ok


def test_disconnect_ends_the_lease_and_hands_over() -> None:
    arb = make()
    reg(arb, 1, "a")
    reg(arb, 2, "b")
    (g1,) = arb.acquire(1, 0, 0)  # uncontended: an extended lease
    shortened = arb.acquire(2, 0, 0)  # b waits; a's lease is cut back to its nominal turn
    assert [(e.client, e.lease, e.deadline_ns) for e in shortened] == [(1, g1.lease, 5_000_000)]
    effects = arb.disconnect(1, 1000)
    assert [e.client for e in effects if isinstance(e, GrantLease)] == [2]
    assert g1.client == 1


def test_record_without_clients_lingers_then_goes_unless_provisioned() -> None:
    arb = make()
    reg(arb, 1, "a")
    arb.provision("p", [0], InstanceSettings(1), 0)
    arb.disconnect(1, NS_PER_S)
    arb.tick(5 * NS_PER_S)
    assert (0, "a") in arb.records
    assert arb.next_wakeup() == 11 * NS_PER_S
    arb.tick(11 * NS_PER_S)
    assert (0, "a") not in arb.records and (0, "p") in arb.records


def test_provision_over_free_weight_is_refused_and_changes_nothing() -> None:
    arb = make(max_inst=4)
    reg(arb, 1, "a", weight=3)
    with pytest.raises(SettingError):
        arb.provision("b", [0, 1], InstanceSettings(2), 0)
    assert (1, "b") not in arb.records and (0, "b") not in arb.records


def test_unprovision_refused_while_clients_are_connected() -> None:
    arb = make()
    arb.provision("a", [0], InstanceSettings(1), 0)
    reg(arb, 1, "a")
    with pytest.raises(SettingError, match="connected"):
        arb.unprovision("a", None, 0)


@pytest.mark.parametrize("bad", [InstanceSettings(weight=17), InstanceSettings(memsize=-1),
                                 InstanceSettings(highprio=2)])
def test_a_provision_refused_on_one_gpu_changes_nothing_on_the_others(bad: InstanceSettings) -> None:
    """Every GPU's settings are checked before any record is made (an admin write is checked, then applied)."""
    arb = make()
    with pytest.raises(CoreError):
        arb.check_provision("a", {0: InstanceSettings(), 1: bad})
    with pytest.raises(CoreError):
        arb.provision_each("a", {0: InstanceSettings(), 1: bad}, 0)
    assert arb.records == {} and not arb.scheds[0].instances


# ----------------------------------------------------- GPU-core percentages (behaviour §3)

def reg_core(arb: Arbiter, cid: int, name: str, percent: int, gpu: int = 0) -> tuple[RegisteredGpu, list[str]]:
    arb.connect(cid, 1000 + cid, 0)
    r, _ = arb.register(cid, name, [gpu], {gpu: InstanceSettings(core_percent=percent)}, 0)
    return r.gpus[0], r.warnings


def test_a_core_percentage_is_weight_p_over_5_of_20_slots_on_policy_3() -> None:
    arb = make(max_inst=16, shape=True)  # policy 1, the default
    info, warnings = reg_core(arb, 1, "a", 30)
    st = arb.scheds[0].settings
    assert (info.weight, st.policy, st.max_inst, warnings) == (6, 3, 20, [])
    info, warnings = reg_core(arb, 2, "b", 100, gpu=1)  # the whole GPU fits once it has 20 slots
    assert (info.weight, arb.scheds[1].settings.max_inst, warnings) == (20, 20, [])


def test_a_core_percentage_caps_the_instance_at_p_percent_even_alone() -> None:
    from cgpu_testing.sim import SimInstance, Simulation

    arb = make(max_inst=16, shape=True)
    info, _ = reg_core(arb, 1, "a", 30)
    st = arb.scheds[0].settings
    res = Simulation(GpuSettings(policy=st.policy, max_inst=st.max_inst),
                     [SimInstance("A", info.weight)]).run(20 * NS_PER_S)
    assert res.instances["A"].share * 100 == pytest.approx(30, abs=0.5)


def test_a_core_percentage_on_a_gpu_set_otherwise_is_the_weight_there_with_a_warning() -> None:
    arb = make(max_inst=16, shape=True)
    reg(arb, 1, "other")  # the GPU is in use on policy 1: it is not switched under it
    info, warnings = reg_core(arb, 2, "a", 30)
    assert info.weight == 6 and arb.scheds[0].settings.policy == 2  # weight 6 > 1 on policy 1 -> 2
    assert len(warnings) == 1 and "policy 3 with max_inst 20" in warnings[0]


@pytest.mark.parametrize("percent", [3, 33, 105, -5, True])  # 0 is "none" here; the wire refuses it
def test_a_core_percentage_off_the_5_percent_grid_is_refused(percent: int) -> None:
    arb = make(max_inst=16)
    arb.connect(1, 1001, 0)
    with pytest.raises(SettingError, match="multiple of 5 from 5 to 100"):
        arb.register(1, "a", [0], {0: InstanceSettings(core_percent=percent)}, 0)
    assert arb.records == {} and arb.scheds[0].settings.policy == 1


def test_inst_ctl_provisions_a_core_percentage() -> None:
    from arbiterd.core.tree import write

    arb = make(max_inst=16)
    write(arb, "inst_ctl", "create job core=45 gpu=0", 0)
    assert (arb.scheds[0].instances["job"].weight, arb.scheds[0].settings.policy) == (9, 3)
    for bad in ("create x core=42", "create x core=30 weight=2", "create x core=abc"):
        with pytest.raises(SettingError):
            write(arb, "inst_ctl", bad, 0)
    assert set(arb.scheds[0].instances) == {"job"}

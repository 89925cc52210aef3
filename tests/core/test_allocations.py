"""Allocations (``alloc_ctl``) and binding them to the container that presents their token."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arbiterd.core import binding, snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo, InstanceSettings
from arbiterd.core.binding import Claimant
from arbiterd.core.errors import ConflictError, CoreError, IdentityError, NotFoundError, SettingError
from arbiterd.core.policies import FIXED_CORE

GIB = 1024**3
POD_A = "0a1b2c3d-1111-2222-3333-444455556666"
POD_B = "0a1b2c3d-1111-2222-3333-777777777777"


def sha(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def make(mode: str = "required") -> Arbiter:
    gpus = [GpuInfo(i, "sim", f"GPU-{i}", 16 * GIB, True) for i in range(2)]
    return Arbiter(gpus, ArbiterConfig(allocations=mode))


def ctl(arb: Arbiter, command: str) -> None:
    tree.write(arb, "alloc_ctl", command, 0)


def who(instance: str, *tokens: str, pod: str | None = POD_A, container: bool = True) -> Claimant:
    return Claimant(instance, instance * 5 if container else None, pod, frozenset(sha(t) for t in tokens))


def register(arb: Arbiter, cid: int, c: Claimant, weight: int = 1, memsize: int = 0) -> list[int]:
    """What the server does for a register: bind, then register on the GPUs the binding names."""
    bound = binding.bind(arb, c, 0)
    gpus = bound.gpus if bound is not None else [0]
    arb.connect(cid, 1000 + cid, 0)
    arb.register(cid, c.instance, gpus, {g: InstanceSettings(weight, False, memsize) for g in gpus}, 0)
    return gpus


@pytest.fixture
def arb() -> Arbiter:
    a = make()
    ctl(a, f"create mem-a token={sha('ta')} gpu=0 memsize=4GiB")
    ctl(a, f"create core-a token={sha('tc')} gpu=0 core=30")
    return a


# ---------------------------------------------------------------- alloc_ctl
def test_listing_status_and_per_gpu_totals(arb: Arbiter) -> None:
    assert tree.read(arb, "alloc_ctl", 0) == (f"core-a gpu=0 memsize=0 core=30 bound=-\n"
                                              f"mem-a gpu=0 memsize={4 * GIB} core=0 bound=-\n")
    assert (arb.allocations.alloc_mem(0), arb.allocations.alloc_core(0)) == (4 * GIB, 30)
    assert (arb.allocations.alloc_mem(1), arb.allocations.alloc_core(1)) == (0, 0)
    assert "alloc_ctl" in tree.read(arb, "", 0).split()


def test_multi_gpu_memory_repeats_the_last_size() -> None:
    a = make()
    ctl(a, f"create big token={sha('t')} gpu=0,1 memsize=16GiB,4GiB")
    ctl(a, f"create two token={sha('u')} gpu=1 memsize=2GiB")
    assert (a.allocations.alloc_mem(0), a.allocations.alloc_mem(1)) == (16 * GIB, 6 * GIB)


@pytest.mark.parametrize(("command", "error", "words"), [
    ("create x token=abc gpu=0 memsize=1GiB", SettingError, "SHA-256"),
    (f"create x token={sha('n')} gpu=7 memsize=1GiB", NotFoundError, "GPU 7"),
    (f"create x token={sha('n')} gpu=0,0 memsize=1GiB", SettingError, "twice"),
    (f"create x token={sha('n')} gpu=0", SettingError, "memsize= or core="),
    (f"create x token={sha('n')} gpu=0 core=33", SettingError, "multiple of 5"),
    (f"create x token={sha('n')} gpu=0,1 core=10", SettingError, "one GPU"),
    (f"create x token={sha('n')} gpu=0 memsize=13GiB", ConflictError, "overcommit"),
    (f"create x token={sha('n')} gpu=0 core=75", ConflictError, "overcommit"),
    (f"create mem-a token={sha('n')} gpu=1 memsize=1GiB", ConflictError, "exists"),
    (f"create x token={sha('ta')} gpu=1 memsize=1GiB", ConflictError, "same token"),
    (f"create x token={sha('n')} gpu=1 size=1", SettingError, "unexpected"),
    ("create ../x token=1 gpu=0", SettingError, "invalid allocation id"),
    (f"create x token={sha('n')} gpu=0 core=10 weight=2", SettingError, "not both"),
    (f"create x token={sha('n')} gpu=0 memsize=1GiB weight=26", SettingError, "weight"),
    (f"create x token={sha('n')} gpu=0 memsize=1GiB highprio=2", SettingError, "highprio"),
    ("remove nope", NotFoundError, "no allocation"),
    ("remove mem-a now", SettingError, "only an id"),
    ("drop mem-a", SettingError, "expected 'create"),
])
def test_refusals_say_why_and_change_nothing(arb: Arbiter, command: str, error: type[CoreError],
                                              words: str) -> None:
    before = snapshot.take(arb)
    with pytest.raises(error, match=words):
        ctl(arb, command)
    assert snapshot.take(arb) == before


def test_overcommit_is_refused_with_409_and_a_full_card_still_takes_exactly_its_size(arb: Arbiter) -> None:
    ctl(arb, f"create m2 token={sha('m2')} gpu=0 memsize=12GiB")  # 4 + 12 = 16: exactly full
    ctl(arb, f"create c2 token={sha('c2')} gpu=0 core=70")  # 30 + 70 = 100
    with pytest.raises(ConflictError) as exc:
        ctl(arb, f"create m3 token={sha('m3')} gpu=0 memsize=1")
    assert exc.value.http_status == 409


def test_create_is_refused_while_allocations_are_off() -> None:
    a = make("off")
    with pytest.raises(ConflictError, match="allocations are off"):
        ctl(a, f"create x token={sha('t')} gpu=0 memsize=1GiB")
    assert "alloc_ctl" not in tree.read(a, "", 0).split()


# ---------------------------------------------------------------- binding
def test_the_first_container_binds_and_gets_its_allocation_whatever_it_claims(arb: Arbiter) -> None:
    assert register(arb, 1, who("aaa", "ta", "tc"), weight=25, memsize=8 * GIB) == [0]
    inst = arb.scheds[0].instances["aaa"]
    assert inst.weight == 6  # 30 % = 6 of 20 slots
    assert arb.scheds[0].settings.policy == FIXED_CORE and arb.scheds[0].settings.max_inst == 20
    assert arb.mem_limit(arb.records[(0, "aaa")]) == 4 * GIB
    assert {a.bound for a in arb.allocations} == {"aaa"}
    assert arb.records[(0, "aaa")].provisioned
    # a second process of the same container binds nothing new
    again = binding.bind(arb, who("aaa", "ta", "tc"), 0)
    assert again is not None and not again.changed


def test_another_container_presenting_a_bound_token_is_refused(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta"))
    with pytest.raises(IdentityError, match="bound to another container"):
        binding.bind(arb, who("bbb", "ta", pod=POD_B), 0)
    with pytest.raises(IdentityError, match="bound to another container"):  # same pod, but aaa is alive
        binding.bind(arb, who("bbb", "ta"), 0)


def test_a_restarted_container_of_the_same_pod_takes_the_allocation_over(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    arb.disconnect(1, 0)
    with pytest.raises(IdentityError, match="bound to another container"):  # another pod: never
        binding.bind(arb, who("ccc", "ta", pod=POD_B), 0)
    register(arb, 2, who("bbb", "ta", "tc"))
    assert {a.bound for a in arb.allocations} == {"bbb"}
    assert (0, "aaa") not in arb.records  # its weight went with it: the card is not full of ghosts
    assert arb.scheds[0].instances["bbb"].weight == 6


def test_memory_and_core_on_different_gpus_are_refused() -> None:
    a = make()
    ctl(a, f"create m token={sha('m')} gpu=0 memsize=1GiB")
    ctl(a, f"create c token={sha('c')} gpu=1 core=30")
    with pytest.raises(IdentityError, match="same GPU"):
        binding.bind(a, who("aaa", "m", "c"), 0)
    assert {x.bound for x in a.allocations} == {None} and not a.records


def test_required_refuses_a_container_without_a_valid_token_but_not_a_host_process(arb: Arbiter) -> None:
    with pytest.raises(IdentityError, match=r"no valid allocation token.*none was found"):
        binding.bind(arb, who("aaa"), 0)
    with pytest.raises(IdentityError, match="match no allocation"):
        binding.bind(arb, who("aaa", "forged"), 0)
    assert binding.bind(arb, who("host", container=False), 0) is None


def test_optional_lets_a_container_without_a_token_register_as_before() -> None:
    a = make("optional")
    assert binding.bind(a, who("aaa"), 0) is None
    assert binding.bind(make("off"), who("aaa", "ta"), 0) is None


def test_removing_an_allocation_reprovisions_its_container(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    ctl(arb, "remove core-a")
    assert arb.scheds[0].instances["aaa"].weight == 1 and arb.mem_limit(arb.records[(0, "aaa")]) == 4 * GIB
    ctl(arb, "remove mem-a")  # its client is still there: the record stays until it leaves, then lingers
    rec = arb.records[(0, "aaa")]
    assert not rec.provisioned
    arb.disconnect(1, 0)
    arb.tick(arb.config.linger_ns)
    assert (0, "aaa") not in arb.records


def test_removing_the_allocation_of_a_gone_container_frees_its_slot_at_once(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    arb.disconnect(1, 0)
    ctl(arb, "remove core-a")
    ctl(arb, "remove mem-a")
    assert (0, "aaa") not in arb.records


def test_a_bind_refused_for_weight_is_refused_by_its_check_before_anything_changes() -> None:
    a = make()
    a.provision("squatter", [0], InstanceSettings(16), 0)  # policy 1, max_inst 16: full
    ctl(a, f"create c token={sha('c')} gpu=0 core=30")
    with pytest.raises(ConflictError, match="free_weight"):
        binding.check(a, who("aaa", "c"))
    assert a.allocations.get("c").bound is None and (0, "aaa") not in a.records
    a.unprovision("squatter", None, 0)
    binding.check(a, who("aaa", "c"))  # room now: the check passes, and the bind does what it checked
    bound = binding.bind(a, who("aaa", "c"), 0)
    assert bound is not None and a.allocations.get("c").bound == "aaa"


def test_an_allocations_weight_and_high_priority_are_its_containers_settings() -> None:
    """A DRA claim's ShareConfig reaches arbiterd as ``weight=`` and ``highprio=``: two containers bound to
    weights 1 and 2 on one card get weights 1 and 2 (policy 1 turns to 2, as with ``inst_ctl``), the second high
    priority, whatever they claim; both survive the state file."""
    a = make()
    ctl(a, f"create w1 token={sha('w1')} gpu=0 memsize=2GiB weight=1")
    ctl(a, f"create w2 token={sha('w2')} gpu=0 memsize=2GiB weight=2 highprio=1")
    assert "w2 gpu=0 memsize=2147483648 core=0 weight=2 highprio=1 bound=-" in tree.read(a, "alloc_ctl", 0)
    register(a, 1, who("aaa", "w1"), weight=9)
    register(a, 2, who("bbb", "w2", pod=POD_B), weight=9)
    got = {n: (i.weight, i.highprio) for n, i in a.scheds[0].instances.items()}
    assert got == {"aaa": (1, False), "bbb": (2, True)}
    assert a.scheds[0].settings.policy == 2
    fresh = make()
    assert snapshot.restore(fresh, snapshot.take(a), 0) == []
    assert (fresh.allocations.get("w2").weight, fresh.allocations.get("w2").highprio) == (2, True)


def test_allocations_and_their_binding_survive_the_state_file(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    doc = snapshot.take(arb)
    fresh = make()
    assert snapshot.restore(fresh, doc, 0) == []
    assert tree.read(fresh, "alloc_ctl", 0) == tree.read(arb, "alloc_ctl", 0)
    assert fresh.allocations.get("mem-a").pod == POD_A
    assert fresh.scheds[0].instances["aaa"].weight == 6
    fresh.connect(1, 1001, 0)
    bound = binding.bind(fresh, who("aaa", "ta", "tc"), 0)
    assert bound is not None and not bound.changed


# ---------------------------------------------------------------- properties
op = st.one_of(
    st.tuples(st.just("create"), st.integers(0, 1), st.integers(0, 20), st.sampled_from([0, 5, 10, 30, 45, 60])),
    st.tuples(st.just("remove"), st.integers(0, 30), st.just(0), st.just(0)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(op, max_size=40))
def test_no_sequence_of_creates_and_removes_overcommits_a_card(ops: list[tuple[str, int, int, int]]) -> None:
    a = make()
    made: list[str] = []
    for n, (verb, x, gib, core) in enumerate(ops):
        try:
            if verb == "create":
                mem = f" memsize={gib}GiB" if gib else ""
                ctl(a, f"create a{n} token={sha(str(n))} gpu={x}{mem}" + (f" core={core}" if core else ""))
                made.append(f"a{n}")
            elif made:
                ctl(a, f"remove {made.pop(x % len(made))}")
        except CoreError:
            pass
        for gpu in (0, 1):
            assert a.allocations.alloc_mem(gpu) <= 16 * GIB
            assert a.allocations.alloc_core(gpu) <= 100
    assert len(a.allocations) == len(made)

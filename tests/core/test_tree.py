"""The settings tree of behaviour §2: every file readable, every rw file writable, refusals change nothing."""

from __future__ import annotations

import pytest

from arbiterd.core import snapshot, tree
from arbiterd.core.arbiter import Arbiter, ArbiterConfig, GpuInfo, InstanceSettings
from arbiterd.core.errors import CoreError, NotFoundError, ReadOnlyError, SettingError

GIB = 1024**3


@pytest.fixture
def arb() -> Arbiter:
    a = Arbiter([GpuInfo(0, "sim", "GPU-a", 16 * GIB, True)], ArbiterConfig())
    a.provision("c1", [0], InstanceSettings(2, False, 4 * GIB), 0)
    a.provision("c2", [0], InstanceSettings(1), 0)
    return a


def test_listings(arb: Arbiter) -> None:
    assert tree.read(arb, "", 0).split() == ["version", "default_memsize", "inst_ctl", "upgrade", "0"]
    assert tree.read(arb, "0", 0).split()[-2:] == ["c1", "c2"]
    assert tree.read(arb, "0/c1", 0).split() == ["id", "weight", "highprio", "memsize", "meminfo", "limit"]


@pytest.mark.parametrize(("path", "value"), [
    ("0/policy", "2"),  # c1 (weight 2) joined policy 1, which switched to 2
    ("0/max_inst", "16"), ("0/prio_ratio", "50"), ("0/free_weight", "13"),
    ("0/major", str(tree.MAJOR)), ("0/c1/id", "c1"), ("0/c1/weight", "2"), ("0/c1/highprio", "0"),
    ("0/c1/memsize", str(4 * GIB)), ("default_memsize", "0"), ("upgrade", "0"),
])
def test_reads(arb: Arbiter, path: str, value: str) -> None:
    assert tree.read(arb, path, 0) == value + "\n"


def test_meminfo_format(arb: Arbiter) -> None:
    assert tree.read(arb, "0/c1/meminfo", 0) == f"Free: {4 * GIB}\n"


@pytest.mark.parametrize(("path", "value", "expect"), [
    ("0/policy", "4", "4"), ("0/max_inst", "20", "20"), ("0/prio_ratio", "70", "70"),
    ("0/c1/weight", "5", "5"), ("0/c1/highprio", "1", "1"), ("0/c1/memsize", "2GiB", str(2 * GIB)),
    ("0/c1/memsize", "1073741824", str(GIB)), ("default_memsize", "1GiB", str(GIB)), ("upgrade", "1", "1"),
    ("0/slice_ms", "10", "10"),
])
def test_valid_writes_take_effect(arb: Arbiter, path: str, value: str, expect: str) -> None:
    tree.write(arb, path, value, 0)
    assert tree.read(arb, path, 0) == expect + "\n"


@pytest.mark.parametrize(("path", "value", "error"), [
    ("0/policy", "6", SettingError), ("0/policy", "-1", SettingError), ("0/policy", "two", SettingError),
    ("0/max_inst", "0", SettingError), ("0/max_inst", "26", SettingError), ("0/max_inst", "2", SettingError),
    ("0/prio_ratio", "19", SettingError), ("0/prio_ratio", "100", SettingError),
    ("0/c1/weight", "0", SettingError), ("0/c1/weight", "16", SettingError),
    ("0/c1/highprio", "2", SettingError), ("0/c1/memsize", "lots", SettingError),
    ("0/c1/memsize", "32GiB", SettingError), ("0/policy", "1\n2", SettingError),
    ("0/free_weight", "3", ReadOnlyError), ("0/major", "1", ReadOnlyError), ("version", "9", ReadOnlyError),
    ("0/c1/id", "x", ReadOnlyError), ("0/c1/meminfo", "x", ReadOnlyError), ("0", "1", ReadOnlyError),
    ("0/nope", "1", NotFoundError), ("1/policy", "1", NotFoundError), ("0/zz/weight", "1", NotFoundError),
    ("../etc/passwd", "1", NotFoundError), ("upgrade", "2", SettingError),
])
def test_invalid_writes_are_refused_and_change_nothing(arb: Arbiter, path: str, value: str,
                                                       error: type[CoreError]) -> None:
    before = snapshot.take(arb)
    with pytest.raises(error) as exc:
        tree.write(arb, path, value, 0)
    assert "\n" not in str(exc.value)
    assert snapshot.take(arb) == before


def test_weight_sum_over_max_inst_is_refused(arb: Arbiter) -> None:
    with pytest.raises(SettingError, match="exceed max_inst"):
        tree.write(arb, "0/c2/weight", "15", 0)
    assert tree.read(arb, "0/c2/weight", 0) == "1\n"


def test_inst_ctl_create_and_remove(arb: Arbiter) -> None:
    tree.write(arb, "inst_ctl", "create web1 gpu=0 weight=3 highprio=1 memsize=2GiB", 0)
    assert "web1 gpu=0 weight=3 highprio=1 memsize=2147483648" in tree.read(arb, "inst_ctl", 0)
    assert tree.read(arb, "0/web1/highprio", 0) == "1\n"
    tree.write(arb, "inst_ctl", "remove web1", 0)
    with pytest.raises(NotFoundError):
        tree.read(arb, "0/web1/weight", 0)


@pytest.mark.parametrize("cmd", ["create", "create ../x", "create a weight=x", "create a gpu=9",
                                 "destroy a", "create a color=red", "create a highprio=3", "remove nope",
                                 "create 'a"])
def test_inst_ctl_bad_commands_change_nothing(arb: Arbiter, cmd: str) -> None:
    before = snapshot.take(arb)
    with pytest.raises(CoreError):
        tree.write(arb, "inst_ctl", cmd, 0)
    assert snapshot.take(arb) == before


def test_snapshot_restores_everything(arb: Arbiter) -> None:
    tree.write(arb, "0/policy", "3", 0)
    tree.write(arb, "0/prio_ratio", "60", 0)
    tree.write(arb, "default_memsize", "1GiB", 0)
    doc = snapshot.take(arb)
    fresh = Arbiter([GpuInfo(0, "sim", "GPU-a", 16 * GIB, True)], ArbiterConfig())
    snapshot.restore(fresh, doc, 0)
    assert snapshot.take(fresh) == doc


@pytest.mark.parametrize("doc", [None, [], {"version": 9}])
def test_malformed_state_is_a_setting_error(doc: object) -> None:
    fresh = Arbiter([GpuInfo(0, "sim", "GPU-a", 16 * GIB, True)], ArbiterConfig())
    with pytest.raises(SettingError):
        snapshot.restore(fresh, doc, 0)

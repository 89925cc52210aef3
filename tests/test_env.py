"""Strict parsing of the container environment (behaviour §6)."""

from __future__ import annotations

import pytest

from libcgpu_client.env import GIB, EnvError, parse_env


def test_defaults() -> None:
    env = parse_env({})
    assert env.gpus == (0,) and env.weight == 1 and not env.highprio and env.memsize == ()
    assert env.on_daemon_loss == "wait" and not env.disabled


def test_full_seed_environment() -> None:
    env = parse_env({"ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1,2,3", "ALIYUN_COM_GPU_MEM_CONTAINER": "3,1",
                     "ALIYUN_COM_GPU_MEM_DEV": "15", "ALIYUN_COM_GPU_SCHD_WEIGHT": "2",
                     "ALIYUN_COM_GPU_HIGH_PRIO": "1"})
    assert env.gpus == (0, 1, 2, 3)
    assert env.memsize == (3 * GIB, GIB, GIB, GIB)  # the last value repeats
    assert env.weight == 2 and env.highprio


def test_uuid_devices_and_zero_memory_means_no_isolation() -> None:
    env = parse_env({"ALIYUN_COM_GPU_VISIBLE_DEVICES": "GPU-1234abcd-0000", "ALIYUN_COM_GPU_MEM_CONTAINER": "0"})
    assert env.gpus == ("GPU-1234abcd-0000",) and env.memsize == ()


def test_cgpu_mem_limit_takes_sizes() -> None:
    assert parse_env({"CGPU_MEM_LIMIT": "600MiB"}).memsize == (600 * 1024**2,)


@pytest.mark.parametrize(("name", "value"), [
    ("CGPU_DISABLE", "maybe"), ("ALIYUN_COM_GPU_MEM_DEV", "15.5"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "3GB"),
    ("ALIYUN_COM_GPU_MEM_CONTAINER", "3,,4"), ("ALIYUN_COM_GPU_MEM_CONTAINER", "1,2"),
    ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "zero"), ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "0,0"),
    ("ALIYUN_COM_GPU_SCHD_WEIGHT", "0"), ("ALIYUN_COM_GPU_SCHD_WEIGHT", "26"), ("ALIYUN_COM_GPU_SCHD_WEIGHT", "x"),
    ("ALIYUN_COM_GPU_HIGH_PRIO", "2"), ("CGPU_ON_DAEMON_LOSS", "panic"), ("CGPU_INSTANCE", "../etc"),
    ("CGPU_IDLE_MS", "fast"), ("CGPU_DEVICE", "tpu"), ("CGPU_MEM_LIMIT", "lots"),
    ("CGPU_CORE_PERCENT", "33"), ("CGPU_CORE_PERCENT", "0"), ("CGPU_CORE_PERCENT", "105"),
    ("CGPU_CORE_PERCENT", "30%"), ("CGPU_CORE_PERCENT", "2.5"), ("CGPU_TORCH_HOOK", "layers"),
    ("CGPU_COLLECTIVE_KERNELS", "all-reduce"), ("CGPU_COLLECTIVE_KERNELS", "nccl,,x"),
])
def test_malformed_values_name_the_variable_the_value_and_the_expectation(name: str, value: str) -> None:
    with pytest.raises(EnvError) as exc:
        parse_env({name: value})
    msg = str(exc.value)
    assert name in msg and repr(value) in msg and "expected" in msg and "\n" not in msg


@pytest.mark.parametrize("hook", ["dispatch", "operator", "module"])
def test_torch_hook_values(hook: str) -> None:
    assert parse_env({"CGPU_TORCH_HOOK": hook}).torch_hook == hook
    assert parse_env({}).torch_hook == "dispatch"


def test_memory_over_the_card_is_refused() -> None:
    with pytest.raises(EnvError, match="ALIYUN_COM_GPU_MEM_DEV"):
        parse_env({"ALIYUN_COM_GPU_MEM_DEV": "4", "ALIYUN_COM_GPU_MEM_CONTAINER": "5"})


def test_disable() -> None:
    assert parse_env({"CGPU_DISABLE": "true"}).disabled
    assert not parse_env({"CGPU_DISABLE": "false"}).disabled


def test_a_core_percentage_is_a_weight_of_p_over_5() -> None:
    env = parse_env({"CGPU_CORE_PERCENT": "30"})
    assert (env.core_percent, env.weight) == (30, 6)
    assert parse_env({}).core_percent == 0


def test_a_core_percentage_and_a_weight_together_are_refused() -> None:
    with pytest.raises(EnvError, match="either it or ALIYUN_COM_GPU_SCHD_WEIGHT, not both"):
        parse_env({"CGPU_CORE_PERCENT": "30", "ALIYUN_COM_GPU_SCHD_WEIGHT": "2"})


def test_collectives_default_to_nccls_kernels_and_vllms_custom_all_reduce() -> None:
    assert parse_env({}).collectives == ("nccl", "cross_device_reduce")
    assert parse_env({"CGPU_COLLECTIVE_KERNELS": "none"}).collectives == ()
    assert parse_env({"CGPU_COLLECTIVE_KERNELS": " a , b_2 "}).collectives == ("a", "b_2")

"""libcgpu.so's pure parts against their Python twins: the msgpack codec and env parsing."""

from __future__ import annotations

import io
import random
import subprocess
from typing import Any

import msgpack
import pytest

import cgpu_protocol as proto
from libcgpu_client.env import EnvError, parse_env
from tests.native.conftest import Native

INTS = [0, 1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**63 - 1, 2**64 - 1,
        -1, -32, -33, -128, -129, -32768, -32769, -(2**31), -(2**31) - 1, -(2**63)]


def value_for(tname: str, variant: int) -> Any:
    if tname.endswith("|nil"):
        return None if variant % 2 else value_for(tname[:-4], variant)
    if tname == "int":
        return INTS[variant % len(INTS)]
    if tname == "str":
        return ["", "GPU-0", "ü" * 20, "x" * 300, "y" * 70_000][variant % 5]
    if tname == "bool":
        return bool(variant % 2)
    if tname == "map":
        return {"gpu": variant, "uuid": "GPU-abc", "weight": 2, "nested": {"list": [1, "a", None, 1.5]}}
    if tname.startswith("list["):
        inner = tname[5:-1].split("|")
        return [value_for(inner[i % len(inner)], variant + i) for i in range(variant % 20)]
    raise AssertionError(tname)


def every_message() -> list[dict[str, Any]]:
    """Each op of the schema (both directions), with all fields and with required fields only."""
    out = []
    tables = [(op, {k: (f.type, f.required) for k, f in cls.FIELDS.items()}) for op, cls in proto.MESSAGES.items()]
    for op, fields in tables:
        for variant in range(len(INTS)):
            full = {"op": op, **{k: value_for(t, variant + i) for i, (k, (t, _)) in enumerate(fields.items())}}
            required = {"op": op, **{k: v for k, v in full.items() if k != "op" and fields[k][1]}}
            out += [full, required]
    return out


def roundtrip(n: Native, data: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(n.codec), "roundtrip"], input=data, capture_output=True, timeout=30)


def test_every_schema_message_round_trips_through_the_c_codec(native: Native) -> None:
    msgs = every_message()
    assert {m["op"] for m in msgs} == set(proto.MESSAGES)
    res = roundtrip(native, b"".join(msgpack.packb(m, use_bin_type=True) for m in msgs if
                                     len(msgpack.packb(m)) <= proto.MAX_MESSAGE))
    assert res.returncode == 0, res.stderr
    back = list(msgpack.Unpacker(io.BytesIO(res.stdout), raw=False))
    assert back == [m for m in msgs if len(msgpack.packb(m)) <= proto.MAX_MESSAGE]


def test_random_values_round_trip(native: Native) -> None:
    rng = random.Random(7)

    def value(depth: int) -> Any:
        kind = rng.randrange(8 if depth < 4 else 5)
        if kind == 0:
            return rng.choice(INTS)
        if kind == 1:
            return "".join(rng.choice("abcé€") for _ in range(rng.choice([0, 5, 31, 32, 255, 256])))
        if kind == 2:
            return rng.choice([True, False, None])
        if kind == 3:
            return rng.uniform(-1e9, 1e9)
        if kind == 4:
            return bytes(rng.randrange(256) for _ in range(rng.choice([0, 3, 300])))
        if kind in (5, 6):
            return [value(depth + 1) for _ in range(rng.choice([0, 1, 15, 16, 40]))]
        return {f"k{i}": value(depth + 1) for i in range(rng.choice([0, 1, 15, 16, 20]))}

    msgs = [{"op": "x", "v": value(0)} for _ in range(300)]
    msgs = [m for m in msgs if len(msgpack.packb(m, use_bin_type=True)) <= proto.MAX_MESSAGE]
    res = roundtrip(native, b"".join(msgpack.packb(m, use_bin_type=True) for m in msgs))
    assert res.returncode == 0, res.stderr
    assert list(msgpack.Unpacker(io.BytesIO(res.stdout), raw=False)) == msgs


@pytest.mark.parametrize("data", [
    msgpack.packb({"op": "grant", "gpu": 0, "lease": 7, "deadline_ns": 2**62})[:-3],  # cut short
    b"\xdb\xff\xff\xff\xff",  # a 4 GiB string header with nothing behind it
    b"\xc1",  # never used in msgpack
    b"\xc7\x01\x05\x00",  # an ext type: not in this protocol
    b"\x91" * 40 + b"\xc0",  # nested deeper than the codec allows
])
def test_truncated_or_invalid_input_is_refused(native: Native, data: bytes) -> None:
    res = roundtrip(native, data)
    assert res.returncode == 1 and b"parse returned" in res.stderr


ENV_CASES: list[dict[str, str]] = [
    {},
    {"CGPU_DISABLE": "true"}, {"CGPU_DISABLE": " Off "}, {"CGPU_DISABLE": "maybe"},
    {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1", "ALIYUN_COM_GPU_MEM_CONTAINER": "3,1"},
    {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "GPU-1234abcd-0000,2"},
    {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,0"}, {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "gpu0"},
    {"ALIYUN_COM_GPU_VISIBLE_DEVICES": "1,"},
    {"ALIYUN_COM_GPU_SCHD_WEIGHT": "25"}, {"ALIYUN_COM_GPU_SCHD_WEIGHT": "26"},
    {"ALIYUN_COM_GPU_SCHD_WEIGHT": "0"}, {"ALIYUN_COM_GPU_SCHD_WEIGHT": "two"},
    {"CGPU_CORE_PERCENT": "30"}, {"CGPU_CORE_PERCENT": " 100 "}, {"CGPU_CORE_PERCENT": "5"},
    {"CGPU_CORE_PERCENT": "33"}, {"CGPU_CORE_PERCENT": "0"}, {"CGPU_CORE_PERCENT": "105"},
    {"CGPU_CORE_PERCENT": "0030"}, {"CGPU_CORE_PERCENT": "30%"},
    {"CGPU_CORE_PERCENT": "30", "ALIYUN_COM_GPU_SCHD_WEIGHT": "2"},
    {"CGPU_CORE_PERCENT": "30", "ALIYUN_COM_GPU_SCHD_WEIGHT": "x"},
    {"ALIYUN_COM_GPU_HIGH_PRIO": "1"}, {"ALIYUN_COM_GPU_HIGH_PRIO": "2"},
    {"ALIYUN_COM_GPU_MEM_CONTAINER": "3"}, {"ALIYUN_COM_GPU_MEM_CONTAINER": "0"},
    {"ALIYUN_COM_GPU_MEM_CONTAINER": "3,4"}, {"ALIYUN_COM_GPU_MEM_CONTAINER": "3.5"},
    {"ALIYUN_COM_GPU_MEM_CONTAINER": "20", "ALIYUN_COM_GPU_MEM_DEV": "16"},
    {"ALIYUN_COM_GPU_MEM_DEV": "0"},
    {"CGPU_MEM_LIMIT": "600MiB"}, {"CGPU_MEM_LIMIT": "1 GiB"}, {"CGPU_MEM_LIMIT": "600MB"},
    {"CGPU_MEM_LIMIT": "1g", "ALIYUN_COM_GPU_MEM_CONTAINER": "3"}, {"CGPU_MEM_LIMIT": "-1G"},
    {"CGPU_INSTANCE": "job-1.a_b"}, {"CGPU_INSTANCE": "-bad"}, {"CGPU_INSTANCE": "a/b"},
    {"CGPU_ON_DAEMON_LOSS": "run"}, {"CGPU_ON_DAEMON_LOSS": "panic"},
    {"CGPU_IDLE_MS": "0.5"}, {"CGPU_IDLE_MS": "0.01"}, {"CGPU_IDLE_MS": "soon"},
    {"CGPU_DEVICE": "CPU"}, {"CGPU_DEVICE": "tpu"}, {"CGPU_NATIVE": "1"}, {"CGPU_NATIVE": "sure"},
    {"CGPU_SOCKET": "/tmp/x.sock"}, {"CGPU_SOCKET": "/" + "s" * 120},
    {"CGPU_COLLECTIVE_KERNELS": "none"}, {"CGPU_COLLECTIVE_KERNELS": " nccl , cross_device_reduce "},
    {"CGPU_COLLECTIVE_KERNELS": "a,b,c,d,e,f,g,h"}, {"CGPU_COLLECTIVE_KERNELS": "a,b,c,d,e,f,g,h,i"},
    {"CGPU_COLLECTIVE_KERNELS": "nccl,"}, {"CGPU_COLLECTIVE_KERNELS": "all-reduce"},
    {"CGPU_COLLECTIVE_KERNELS": "x" * 63}, {"CGPU_COLLECTIVE_KERNELS": "x" * 64},
]


def describe(env: dict[str, str]) -> str:
    try:
        e = parse_env(env)
    except EnvError as exc:
        return f"error: {exc}"
    gpus = ",".join(str(g) for g in e.gpus)
    mem = ",".join(str(m) for m in e.memsize)
    return (f"disabled={int(e.disabled)} socket={e.socket} instance={e.instance or ''} weight={e.weight} "
            f"core={e.core_percent} highprio={int(e.highprio)} on_loss={e.on_daemon_loss} idle_ms={e.idle_ms:g} "
            f"device={e.device} native={int(e.native)} gpus={gpus} memsize={mem} "
            f"collectives={','.join(e.collectives)}")


@pytest.mark.parametrize("env", ENV_CASES, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()) or "empty")
def test_c_env_parsing_agrees_with_python(native: Native, env: dict[str, str]) -> None:
    res = subprocess.run([str(native.codec), "env"], env=env, capture_output=True, text=True, timeout=10)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == describe(env)

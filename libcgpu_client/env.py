"""Strict parsing of the container-side environment (behaviour §6 plus cgpu's own variables).

:data:`VARIABLES` lists every variable and what it means (the ``cgpu-run`` man
page is generated from it, and a test keeps the README in step). Every malformed value is an
:class:`EnvError` whose message names the variable, the bad value and what
was expected. Nothing falls back silently.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cgpu_protocol.names import NAME_RULE, is_name

GIB = 1024**3
VARIABLES = {
    "CGPU_DISABLE": "true: bypass the arbiter entirely",
    "ALIYUN_COM_GPU_MEM_DEV": "whole GiB of each card (e.g. 15 for a T4)",
    "ALIYUN_COM_GPU_MEM_CONTAINER": "visible GiB: 3 every card, 3,4,5,6 per card, 3,1 on 4 cards = 3,1,1,1; "
                                    "unset or 0: no isolation",
    "ALIYUN_COM_GPU_VISIBLE_DEVICES": "0,1 or GPU-...,GPU-... (default 0)",
    "ALIYUN_COM_GPU_SCHD_WEIGHT": "weight 1..max_inst",
    "ALIYUN_COM_GPU_HIGH_PRIO": "0 or 1: a high-priority instance",
    "CGPU_CORE_PERCENT": "cgpu extension: a GPU-core percentage instead of a weight, 5..100 in steps of 5 "
                         "(weight P/5 of 20 slots on policy 3); with ALIYUN_COM_GPU_SCHD_WEIGHT it is an error",
    "CGPU_CORE_LIMIT": "cgpu extension: the most GPU time (%) the container asks to be held to, 5..100, even on an "
                       "idle GPU; not below its request (weight / max_inst); an environment may only lower a limit",
    "CGPU_MEM_LIMIT": "cgpu extension: limit per card as a size (600MiB, 1GiB,2GiB); "
                      "wins over ALIYUN_COM_GPU_MEM_CONTAINER",
    "CGPU_SOCKET": "path of arbiter.sock (default /run/cgpu/arbiter.sock)",
    "CGPU_INSTANCE": "the instance id a process outside a container declares",
    "CGPU_ON_DAEMON_LOSS": "wait (default) or run: what GPU work does while arbiterd is unreachable",
    "CGPU_IDLE_MS": "give an unused lease back after this many ms (default 3)",
    "CGPU_DEVICE": "auto (default), cuda, or cpu (the CPU acts as the simulated GPU)",
    "CGPU_TORCH_HOOK": "how the CPU as simulated GPU gates PyTorch: dispatch (default), operator or module",
    "CGPU_NATIVE": "1 when libcgpu.so is preloaded and enforces CUDA itself (set by cgpu-run)",
    "CGPU_COLLECTIVE_KERNELS": "kernels whose name contains one of these (comma-separated; default "
                               "nccl,cross_device_reduce) are "
                               "collectives, counted so that a job's ranks end a gang turn at the same one; none: "
                               "no counting",
}
DEFAULT_SOCKET = "/run/cgpu/arbiter.sock"
# NCCL's kernels (ncclKernel_* to 2.18, ncclDevKernel_* from 2.19) and vLLM's and SGLang's custom all-reduce
# (vllm::cross_device_reduce_1stage and _2stage, mangled)
COLLECTIVES = ("nccl", "cross_device_reduce")
_UUID = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]{4,80}")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class EnvError(ValueError):
    """A malformed environment variable (one line: variable, value, expectation)."""

    def __init__(self, message: str, name: str = "", value: str = "", expected: str = "") -> None:
        super().__init__(message)
        self.name, self.value, self.expected = name, value, expected


def _bad(name: str, value: str, expected: str) -> EnvError:
    return EnvError(f"{name}={value!r}: expected {expected}", name, value, expected)


def parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise _bad(name, value, "true or false (also 1/0, yes/no)")


def parse_int(name: str, value: str, lo: int, hi: int) -> int:
    v = value.strip()
    if not re.fullmatch(r"\d+", v) or not lo <= int(v) <= hi:
        raise _bad(name, value, f"an integer {lo}..{hi}")
    return int(v)


def parse_mem_list(name: str, value: str, cards: int | None = None) -> list[int]:
    """``3`` -> [3]; ``3,4,5`` -> [3,4,5]; expanded to ``cards`` with the last value repeating."""
    parts = [p.strip() for p in value.split(",")]
    if not parts or any(not re.fullmatch(r"\d+", p) for p in parts):
        raise _bad(name, value, "whole GiB like 3 or a list like 3,4,5")
    vals = [int(p) for p in parts]
    if cards is not None:
        if len(vals) > cards:
            raise _bad(name, value, f"at most {cards} value(s), one per visible card")
        vals += [vals[-1]] * (cards - len(vals))
    return vals


_SIZE = re.compile(r"^(\d+)\s*(|B|KiB|MiB|GiB|TiB|K|M|G|T)$", re.IGNORECASE)
_UNIT = {"": 1, "b": 1, "k": 1024, "kib": 1024, "m": 1024**2, "mib": 1024**2, "g": GIB, "gib": GIB,
         "t": 1024**4, "tib": 1024**4}


def parse_size_list(name: str, value: str, cards: int | None = None) -> list[int]:
    """``600MiB`` or ``1GiB,2GiB`` (binary units) -> bytes per card, the last value repeating."""
    out = []
    for part in value.split(","):
        m = _SIZE.match(part.strip())
        if not m:
            raise _bad(name, value, "sizes like 600MiB or 1GiB,2GiB")
        out.append(int(m.group(1)) * _UNIT[m.group(2).lower()])
    if cards is not None:
        if len(out) > cards:
            raise _bad(name, value, f"at most {cards} value(s), one per visible card")
        out += [out[-1]] * (cards - len(out))
    return out


def parse_devices(name: str, value: str) -> list[int | str]:
    parts = [p.strip() for p in value.split(",")]
    out: list[int | str] = []
    for p in parts:
        if re.fullmatch(r"\d{1,3}", p):
            out.append(int(p))
        elif _UUID.fullmatch(p):
            out.append(p)
        else:
            raise _bad(name, value, "GPU indices like 0,1 or UUIDs like GPU-xxxxxxxx-...")
    if len(set(out)) != len(out):
        raise _bad(name, value, "each GPU once")
    return out


@dataclass(frozen=True, slots=True)
class ClientEnv:
    disabled: bool = False
    socket: str = DEFAULT_SOCKET
    instance: str | None = None
    gpus: tuple[int | str, ...] = (0,)
    weight: int = 1
    highprio: bool = False
    memsize: tuple[int, ...] = ()  # bytes per visible card; empty: no limit
    mem_dev_gib: int | None = None
    on_daemon_loss: str = "wait"
    idle_ms: float = 3.0
    device: str = "auto"
    native: bool = False
    torch_hook: str = "dispatch"
    core_percent: int = 0  # a GPU-core percentage (weight is core_percent // 5); 0: none
    limit: int = 0  # CGPU_CORE_LIMIT: the most GPU time (%) it asks to be held to; 0: none stated
    collectives: tuple[str, ...] = COLLECTIVES  # CGPU_COLLECTIVE_KERNELS: parts of collective kernels' names


def parse_env(environ: Mapping[str, str] | None = None) -> ClientEnv:
    """Read the client's settings from ``environ`` (default: os.environ)."""
    env = os.environ if environ is None else environ

    def get(name: str) -> str | None:
        v = env.get(name)
        return None if v is None or v.strip() == "" else v

    disabled = parse_bool("CGPU_DISABLE", v) if (v := get("CGPU_DISABLE")) else False
    gpus: list[int | str] = [0]
    if (v := get("ALIYUN_COM_GPU_VISIBLE_DEVICES")) is not None:
        gpus = parse_devices("ALIYUN_COM_GPU_VISIBLE_DEVICES", v)
    weight = parse_int("ALIYUN_COM_GPU_SCHD_WEIGHT", v, 1, 25) if (v := get("ALIYUN_COM_GPU_SCHD_WEIGHT")) else 1
    core = 0
    if (v := get("CGPU_CORE_PERCENT")) is not None:
        expected = "a multiple of 5 from 5 to 100 (a GPU-core percentage)"
        if not re.fullmatch(r"\d{1,3}", v.strip()) or not 5 <= int(v) <= 100 or int(v) % 5:
            raise _bad("CGPU_CORE_PERCENT", v, expected)
        if get("ALIYUN_COM_GPU_SCHD_WEIGHT") is not None:
            raise _bad("CGPU_CORE_PERCENT", v, "either it or ALIYUN_COM_GPU_SCHD_WEIGHT, not both")
        core = int(v)
        weight = core // 5
    highprio = False
    if (v := get("ALIYUN_COM_GPU_HIGH_PRIO")) is not None:
        highprio = bool(parse_int("ALIYUN_COM_GPU_HIGH_PRIO", v, 0, 1))
    mem_dev = parse_int("ALIYUN_COM_GPU_MEM_DEV", v, 1, 4096) if (v := get("ALIYUN_COM_GPU_MEM_DEV")) else None
    mem: list[int] = []
    if (v := get("ALIYUN_COM_GPU_MEM_CONTAINER")) is not None:
        mem = parse_mem_list("ALIYUN_COM_GPU_MEM_CONTAINER", v, len(gpus))
        if mem_dev is not None and any(m > mem_dev for m in mem):
            raise _bad("ALIYUN_COM_GPU_MEM_CONTAINER", v,
                       f"at most ALIYUN_COM_GPU_MEM_DEV={mem_dev} GiB per card")
        mem = [m * GIB for m in mem]
        if all(m == 0 for m in mem):
            mem = []
    if (v := get("CGPU_MEM_LIMIT")) is not None:
        mem = parse_size_list("CGPU_MEM_LIMIT", v, len(gpus))
        if all(m == 0 for m in mem):
            mem = []
    instance = get("CGPU_INSTANCE")
    if instance is not None and not is_name(instance):
        raise _bad("CGPU_INSTANCE", instance, NAME_RULE)
    loss = get("CGPU_ON_DAEMON_LOSS") or "wait"
    if loss not in ("wait", "run"):
        raise _bad("CGPU_ON_DAEMON_LOSS", loss, "wait or run")
    idle_ms = 3.0
    if (v := get("CGPU_IDLE_MS")) is not None:
        try:
            idle_ms = float(v)
        except ValueError:
            raise _bad("CGPU_IDLE_MS", v, "milliseconds, 0.1..10000") from None
        if not 0.1 <= idle_ms <= 10000:
            raise _bad("CGPU_IDLE_MS", v, "milliseconds, 0.1..10000")
    device = (get("CGPU_DEVICE") or "auto").strip().lower()
    if device not in ("auto", "cuda", "cpu"):
        raise _bad("CGPU_DEVICE", device, "auto, cuda or cpu")
    native = parse_bool("CGPU_NATIVE", v) if (v := get("CGPU_NATIVE")) else False
    torch_hook = (get("CGPU_TORCH_HOOK") or "dispatch").strip().lower()
    if torch_hook not in ("dispatch", "operator", "module"):
        raise _bad("CGPU_TORCH_HOOK", torch_hook, "dispatch, operator or module")
    sock = get("CGPU_SOCKET") or DEFAULT_SOCKET
    if "\0" in sock or len(sock) > 107:
        raise _bad("CGPU_SOCKET", sock, "a UNIX socket path of at most 107 bytes")
    limit = parse_int("CGPU_CORE_LIMIT", v, 5, 100) if (v := get("CGPU_CORE_LIMIT")) else 0
    collectives = parse_collectives(v) if (v := get("CGPU_COLLECTIVE_KERNELS")) is not None else COLLECTIVES
    return ClientEnv(disabled, sock, instance, tuple(gpus), weight, highprio, tuple(mem), mem_dev,
                     loss, idle_ms, device, native, torch_hook, core, limit, collectives)


def parse_collectives(value: str) -> tuple[str, ...]:
    """CGPU_COLLECTIVE_KERNELS: ``none``, or 1-8 comma-separated parts of kernel names."""
    v = value.strip()
    if v == "none":
        return ()
    parts = tuple(p.strip() for p in v.split(","))
    if len(v) >= 600 or len(parts) > 8 or not all(re.fullmatch(r"[A-Za-z0-9_]{1,63}", p) for p in parts):
        raise _bad("CGPU_COLLECTIVE_KERNELS", value, "none, or 1-8 comma-separated parts of kernel names "
                                                    "(A-Z a-z 0-9 _, up to 63 each)")
    return parts

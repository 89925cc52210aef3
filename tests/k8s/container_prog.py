"""What runs inside a fake-kubelet "container" in the end-to-end tests.

    python container_prog.py register            register, print the daemon's reply
    python container_prog.py reserve GIB...      register, then mem_reserve each amount in turn
    python container_prog.py spin SECONDS        work through the gate for SECONDS, print the time held

It reads the settings from its environment *as they are*, with no client-side checks, and
sends them: a container that sets ``ALIYUN_COM_GPU_SCHD_WEIGHT=25`` claims weight 25 (and
no core percentage), one that sets a larger ``ALIYUN_COM_GPU_MEM_CONTAINER`` claims that.
The daemon must apply the container's allocation whatever it claims. One JSON line out.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import msgpack

GIB = 1 << 30


def claimed() -> dict[str, Any]:
    env = os.environ
    msg: dict[str, Any] = {"gpus": [int(g) for g in env.get("ALIYUN_COM_GPU_VISIBLE_DEVICES", "0").split(",")]}
    if "ALIYUN_COM_GPU_SCHD_WEIGHT" in env:
        msg["weight"] = int(env["ALIYUN_COM_GPU_SCHD_WEIGHT"])
    elif "CGPU_CORE_PERCENT" in env:
        msg["core_percent"] = int(env["CGPU_CORE_PERCENT"])
        msg["weight"] = msg["core_percent"] // 5
    if env.get("ALIYUN_COM_GPU_MEM_CONTAINER"):
        msg["memsize"] = [int(x) * GIB for x in env["ALIYUN_COM_GPU_MEM_CONTAINER"].split(",")]
    return msg


class Raw:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(path)
        self.unpacker = msgpack.Unpacker(raw=False)

    def call(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.sock.sendall(msgpack.packb(msg, use_bin_type=True))
        while True:
            for reply in self.unpacker:
                return reply  # type: ignore[no-any-return]
            data = self.sock.recv(65536)
            if not data:
                return {"op": "closed"}
            self.unpacker.feed(data)


def register() -> tuple[Raw, dict[str, Any]]:
    raw = Raw(os.environ["CGPU_SOCKET"])
    raw.call({"op": "hello", "versions": [1], "client": "k8s-e2e"})
    return raw, raw.call({"op": "register", "id": 1, "instance": None, **claimed()})


def main() -> None:
    mode = sys.argv[1]
    if mode == "register":
        print(json.dumps(register()[1]))
    elif mode == "reserve":
        raw, reply = register()
        results = [raw.call({"op": "mem_reserve", "id": 2 + i, "gpu": reply["gpus"][0]["gpu"], "bytes": int(g) * GIB})
                   for i, g in enumerate(sys.argv[2:])] if reply.get("op") == "registered" else []
        print(json.dumps({"registered": reply, "reserve": results}))
    elif mode == "spin":
        from libcgpu_client.client import Client
        from libcgpu_client.gate import Gate

        c = claimed()
        client = Client(os.environ["CGPU_SOCKET"], None, c["gpus"], weight=c.get("weight", 1),
                        memsize=c.get("memsize"), core_percent=c.get("core_percent", 0))
        assert client.start(10.0), "no daemon"
        gate = Gate(client, c["gpus"][0], idle_ms=3.0)
        intervals = []
        end = time.monotonic() + float(sys.argv[2])
        while time.monotonic() < end:
            with gate.work():
                t0 = time.monotonic_ns()
                while time.monotonic_ns() - t0 < 250_000:  # short ops: little of a lease is left unused
                    pass
                intervals.append((t0, time.monotonic_ns()))
        gate.close()
        client.close()
        print(json.dumps({"intervals": intervals}))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main()

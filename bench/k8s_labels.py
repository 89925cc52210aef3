"""bench.k8s's last check: every running pod's metrics carry its pod, namespace and container.

At the end of a replay, each pod still running (admitted, and not split: arbiterd refuses a split
pod's container) starts one container that registers with arbiterd, as a CUDA program's first call
would; then ``/metrics`` is scraped once. A container arbiterd refuses at registration (a memory-only
pod takes weight 1 on its card, and a card whose 20 slots core percentages filled has none left) has
no series, and is counted apart, with arbiterd's reason. A pod counts as labelled when every per-instance series of
its container's instance (``cgpu_instance_memory_limit_bytes``, ``cgpu_instance_weight``) carries the
namespace, pod and container the kubelet (device plugin: PodResources) or the claim (DRA: its
``reservedFor`` and pod) gives it, and the GPU's ``UUID``. The plugin names allocations within a poll,
so the check waits up to ``WAIT_S`` for the last ones.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from cgpu_device_plugin.admin import AdminClient
from cgpu_testing.kubelet import RunningContainer

WAIT_S = 10.0
SERIES = ("cgpu_instance_memory_limit_bytes", "cgpu_instance_weight")
# a container's first call: hello and register on its visible GPUs, with nothing else claimed
REGISTER = (
    "import json, os, socket, msgpack\n"
    "s = socket.socket(socket.AF_UNIX); s.settimeout(20); s.connect(os.environ['CGPU_SOCKET'])\n"
    "u = msgpack.Unpacker(raw=False)\n"
    "def call(m):\n"
    "    s.sendall(msgpack.packb(m))\n"
    "    while True:\n"
    "        for r in u: return r\n"
    "        u.feed(s.recv(65536))\n"
    "call({'op': 'hello', 'versions': [1], 'client': 'bench.k8s'})\n"
    "gpus = [int(g) for g in os.environ.get('ALIYUN_COM_GPU_VISIBLE_DEVICES', '0').split(',')]\n"
    "r = call({'op': 'register', 'id': 1, 'instance': None, 'gpus': gpus})\n"
    "print(r['op'] if r['op'] == 'registered' else f\"{r['op']}: {r.get('message')}\")\n"
)


@dataclass(frozen=True)
class Expected:
    """A running pod's container, and the names its series must carry."""

    namespace: str
    pod: str
    container: str
    start: Callable[[Sequence[str]], RunningContainer]  # runs argv as that container


@dataclass
class Labelled:
    labelled: int  # registered pods whose every series carries their names
    registered: int
    problems: list[str]  # a line per registered pod whose series do not
    refused: list[str]  # a line per pod whose container arbiterd refused at registration
    pods: frozenset[str] = frozenset()  # the names of the pods whose container registered


def check(admin: AdminClient, pods: Sequence[Expected]) -> Labelled:
    """Start a container of each of ``pods`` and check the series of those that registered."""
    instances: dict[str, Expected] = {}
    refused = []
    for e in pods:
        rc = e.start([sys.executable, "-c", REGISTER])
        code, out, err = rc.wait(60)
        if code != 0 or out.strip() != "registered":
            refused.append(f"{e.namespace}/{e.pod}: {out.strip() or err.strip()[-200:]}")
            continue
        instances[rc.cid[:12]] = e
    deadline = time.monotonic() + WAIT_S
    while True:
        bad = _mislabelled(admin, instances)
        if not bad or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    problems = [f"{instances[i].namespace}/{instances[i].pod}: {why}" for i, why in sorted(bad.items())]
    return Labelled(len(instances) - len(bad), len(instances), problems, refused,
                    frozenset(e.pod for e in instances.values()))


def _mislabelled(admin: AdminClient, instances: dict[str, Expected]) -> dict[str, str]:
    """Instance -> what is wrong with its series (nothing for those all right)."""
    seen: dict[str, list[dict[str, str]]] = {}
    for f in text_string_to_metric_families(admin.request("GET", "/metrics")):
        for s in f.samples:
            if s.name in SERIES and s.labels.get("instance") in instances:
                seen.setdefault(s.labels["instance"], []).append(s.labels)
    uuids = {str(g["index"]): g["uuid"] for g in admin.status()["gpus"]}
    bad = {}
    for inst, e in instances.items():
        want = {"namespace": e.namespace, "pod": e.pod, "container": e.container}
        got = seen.get(inst, [])
        if len(got) < len(SERIES):
            bad[inst] = "no series of its instance"
        elif any({k: s.get(k) for k in want} != want or s.get("UUID") != uuids.get(s["gpu"]) for s in got):
            names = sorted({(s.get("namespace"), s.get("pod"), s.get("container")) for s in got})
            bad[inst] = f"series labelled {names}"
    return bad

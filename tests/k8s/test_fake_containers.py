"""The fake kubelet's containers are real enough for arbiterd: it identifies them by their fake /proc.

A second arbiterd, with allocations off, serves the client socket the plugin mounts; the plugin allocates on the
node's arbiterd. This checks the harness the end-to-end tests stand on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from cgpu_testing.daemon import DaemonProc
from cgpu_testing.kubelet import CORE, MEM
from tests.k8s.conftest import RecordedNode as Node

PROG = str(Path(__file__).with_name("container_prog.py"))


def test_arbiterd_identifies_a_fake_container_from_its_fake_proc_entries(node: Node) -> None:
    with DaemonProc(node.root / "d", "--sim-gpus", "2x16GiB", "--identity", "cgroup", "--client-env-max-weight", "25",
                    "--proc-root", str(node.kubelet.proc_root)) as daemon:
        node.start_plugin(socket_dir=str(daemon.run_dir))
        pod = node.kubelet.admit("a", [{MEM: 4, CORE: 30}])
        rc = node.kubelet.start_container(pod, [sys.executable, PROG, "register"])
        code, out, err = rc.wait()
        assert code == 0, err
        reply = json.loads(out)
        assert reply["op"] == "registered" and reply["instance"] == rc.cid[:12]
        # the daemon, told to trust an environment up to weight 25 (cGPU's way), takes 30 % as weight 6
        assert reply["gpus"][0]["gpu"] == 0 and reply["gpus"][0]["weight"] == 6
        assert reply["gpus"][0]["mem_limit"] == 4 << 30

"""Who may do what: identity from cgroups, no settings through the client socket, private admin."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arbiterd.core.errors import IdentityError, SettingError
from arbiterd.core.names import valid_instance_id
from arbiterd.server.identity import IdentityResolver, Peer, container_id_from_cgroup
from cgpu_testing.containers import fake_cgroup
from tests.helpers import RawClient

CID = "4f1c2b8e9d7a6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170f6e5d4c"
OTHER = "9" * 64
CGROUPS = {
    "docker (v1)": f"12:memory:/docker/{CID}\n11:cpu:/docker/{CID}\n",
    "docker (systemd)": f"0::/system.slice/docker-{CID}.scope\n",
    "containerd": f"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-{CID}.scope\n",
    "cri-o": f"0::/kubepods.slice/kubepods-burstable.slice/crio-{CID}.scope\n",
    "kubepods (v1)": f"4:devices:/kubepods/burstable/pod0b7e1b4a-5b51-4e8e-9a2c-1f6c0e8a9b3d/{CID}\n",
    "podman": f"0::/machine.slice/libpod-{CID}.scope\n",
}


@pytest.mark.parametrize("form", sorted(CGROUPS))
def test_container_id_is_read_from_every_cgroup_form(form: str) -> None:
    assert container_id_from_cgroup(CGROUPS[form]) == CID


def test_host_process_has_no_container() -> None:
    assert container_id_from_cgroup("0::/user.slice/user-0.slice/session-3.scope\n") is None


def fake_proc(tmp: Path, pid: int, content: str) -> str:
    fake_cgroup(tmp, pid, content)
    return str(tmp)


def test_container_process_is_its_container_and_cannot_declare_another(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, os.getpid(), CGROUPS["docker (systemd)"]))
    peer = r.peer(os.getpid(), 0)
    assert r.identify(peer, None).instance == CID[:12]
    assert r.identify(peer, CID[:12]).instance == CID[:12]
    assert r.identify(peer, CID).instance == CID[:12]
    with pytest.raises(IdentityError, match="may not act as"):
        r.identify(peer, OTHER[:12])


def test_host_process_is_its_uid_and_may_not_declare_another_instance(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, os.getpid(), "0::/user.slice\n"))
    peer = r.peer(os.getpid(), 1000)
    assert r.identify(peer, None).instance == "uid-1000"
    with pytest.raises(IdentityError, match="may not act as dev-a"):
        r.identify(peer, "dev-a")
    assert r.identify(peer, "dev-a", lambda name: 1000).instance == "dev-a"  # provisioned for uid 1000


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", " x", "-rf", "x" * 200, "a\nb", "$(reboot)"])
def test_instance_ids_are_validated(bad: str) -> None:
    with pytest.raises(SettingError):
        valid_instance_id(bad)
    with pytest.raises(SettingError):
        IdentityResolver("declared").identify(Peer(1, 0), bad)


def test_a_containerised_client_cannot_register_as_another_instance(daemon_factory: type, short_tmp: Path) -> None:
    """End to end: the daemon reads our (fake) cgroup through --proc-root and refuses the lie."""
    proc_root = fake_proc(short_tmp / "proc", os.getpid(), CGROUPS["containerd"])
    d = daemon_factory.start("--sim-gpus", "1x1GiB", "--proc-root", proc_root)
    liar = RawClient(d.sock)
    reply = liar.hello_register(OTHER[:12])
    assert reply["op"] == "error" and reply["code"] == "identity"
    honest = RawClient(d.sock)
    reply = honest.hello_register(None)  # type: ignore[arg-type]
    assert reply["op"] == "registered" and reply["instance"] == CID[:12]
    liar.close()
    honest.close()


def test_client_socket_cannot_change_settings_after_first_registration(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared")
    assert d.ctl("echo", "create tenant weight=2 memsize=1GiB", "inst_ctl").returncode == 0
    c = RawClient(d.sock)
    reply = c.hello_register("tenant", weight=9, highprio=1, memsize=[8 * 1024**3])
    assert reply["gpus"][0]["weight"] == 2 and reply["gpus"][0]["highprio"] == 0
    assert reply["gpus"][0]["mem_limit"] == 1024**3
    c.send({"op": "register", "id": 2, "instance": "tenant", "gpus": [0], "weight": 9})
    again = c.recv()
    assert again["op"] == "error" and again["code"] == "identity"
    for op in ({"op": "weight", "id": 3, "gpu": 0, "weight": 9}, {"op": "set", "id": 4, "path": "0/policy"}):
        c.send(op)
        assert c.recv()["code"] == "unknown_op"
    assert d.ctl("cat", "0/tenant/weight").stdout == "2\n"
    c.close()


def test_untrusted_env_is_ignored_when_trust_is_off(daemon_factory: type) -> None:
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared", "--no-trust-client-env")
    c = RawClient(d.sock)
    reply = c.hello_register("t", weight=5, highprio=1)
    assert reply["gpus"][0]["weight"] == 1 and reply["gpus"][0]["highprio"] == 0
    c.close()

"""Who a client is: fixed from its PID's cgroup when it connects, guarded against a reused PID; a host process is
its uid, or an instance provisioned for that uid; what it declares is taken only under identity = declared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from arbiterd.core.errors import IdentityError, SettingError
from arbiterd.server.identity import IdentityResolver, Peer, container_id_from_cgroup, start_time
from cgpu_testing.containers import fake_cgroup

CID = "0123456789ab" + "c" * 52
ME = os.getpid()


@pytest.mark.parametrize("line", [
    f"0::/system.slice/docker-{CID}.scope",
    f"12:memory:/docker/{CID}",
    f"8:pids:/docker/{CID}",
    f"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-{CID}.scope",
    f"0::/kubepods/besteffort/pod0a1b2c3d-1111-2222-3333-444455556666/{CID}",
    f"0::/machine.slice/libpod-{CID}.scope",
    f"0::/system.slice/crio-{CID}.scope",
])
def test_container_id_in_every_runtime_form(line: str) -> None:
    assert container_id_from_cgroup(line + "\n") == CID


def test_no_container_on_a_host_cgroup() -> None:
    assert container_id_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None


def fake_proc(root: Path, pid: int, cgroup: str) -> str:
    fake_cgroup(root, pid, cgroup)
    return str(root)


def test_a_containerised_process_is_its_container(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, ME, f"0::/system.slice/docker-{CID}.scope"))
    peer = r.peer(ME, 0)
    assert (peer.container, peer.tenant, peer.started) == (CID, CID[:12], start_time(ME))
    assert r.identify(peer, None).instance == CID[:12]
    assert r.identify(peer, CID).instance == CID[:12]
    with pytest.raises(IdentityError, match="may not act as other"):
        r.identify(peer, "other")


def test_a_container_cannot_use_an_instance_provisioned_for_a_host_uid(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, ME, f"0::/system.slice/docker-{CID}.scope"))
    with pytest.raises(IdentityError, match="not yours: it is provisioned for a host user"):
        r.identify(r.peer(ME, 0), None, lambda name: 1000)


def test_a_host_process_is_its_uid_or_an_instance_provisioned_for_it(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, ME, "0::/user.slice"))
    peer = r.peer(ME, 1000)
    assert peer.container is None and peer.tenant == "uid-1000"
    assert r.identify(peer, None) == r.identify(peer, "uid-1000")
    assert (r.identify(peer, None).instance, r.identify(peer, None).host_uid) == ("uid-1000", 1000)
    owners = {"dev": 1000, "theirs": 1001}
    assert r.identify(peer, "dev", owners.get).instance == "dev"
    with pytest.raises(IdentityError, match="it is not yours: it is provisioned for another user"):
        r.identify(peer, "theirs", owners.get)
    for other in (CID[:12], "uid-1001", "job-a", "uid-10000", "uid-1000.train"):  # one instance a uid, no more
        with pytest.raises(IdentityError, match=f"not in a container; it may not act as {other}"):
            r.identify(peer, other, owners.get)


def test_host_clients_can_be_refused(tmp_path: Path) -> None:
    r = IdentityResolver("cgroup", fake_proc(tmp_path, ME, "0::/user.slice"), host_clients="refuse")
    with pytest.raises(IdentityError, match="containers only"):
        r.identify(r.peer(ME, 0), None)


def test_a_peer_whose_cgroup_cannot_be_read_is_refused_never_taken_for_the_host(tmp_path: Path) -> None:
    with pytest.raises(IdentityError, match="cgroup cannot be read"):
        IdentityResolver("cgroup", str(tmp_path)).peer(ME, 0)  # no <proc>/<pid>/cgroup
    with pytest.raises(IdentityError, match="no PID"):
        IdentityResolver("cgroup", str(tmp_path)).peer(0, -1)


def test_a_peer_that_exited_or_whose_pid_is_newer_than_the_connection_is_refused(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    r = IdentityResolver("cgroup", fake_proc(tmp_path, child.pid, "0::/user.slice"))
    with pytest.raises(IdentityError, match="exited"):
        r.peer(child.pid, 0)
    r = IdentityResolver("cgroup", fake_proc(tmp_path / "b", ME, "0::/user.slice"))
    with pytest.raises(IdentityError, match="PID was reused"):
        r.peer(ME, 0, accepted=0)  # this process started after "the accept": its PID is a reuse
    assert r.peer(ME, 0).started == start_time(ME)
    assert r.still_there(r.peer(ME, 0))
    assert not r.still_there(Peer(ME, 0, started=1))


def test_the_kernels_pidfd_pins_the_peer_while_its_cgroup_is_read(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        fd = os.pidfd_open(child.pid)
        r = IdentityResolver("cgroup", fake_proc(tmp_path, child.pid, f"0::/system.slice/docker-{CID}.scope"))
        assert r.peer(child.pid, 0, pidfd=fd, accepted=0).container == CID  # the pidfd vouches for it
        with pytest.raises(OSError):
            os.fstat(fd)  # and was closed
    finally:
        child.kill()
        child.wait()


def test_declared_mode_trusts_the_declaration_and_checks_its_form(tmp_path: Path) -> None:
    r = IdentityResolver("declared", fake_proc(tmp_path, ME, f"0::/system.slice/docker-{CID}.scope"))
    peer = r.peer(ME, 0)
    assert r.identify(peer, "anything").instance == "anything"
    assert r.identify(peer, None).instance == f"pid-{ME}"
    assert IdentityResolver("declared", str(tmp_path / "none")).peer(ME, 0).container is None  # unreadable: host
    with pytest.raises(SettingError):
        r.identify(peer, "../etc")


@pytest.mark.parametrize("bad", ["a\n", "a\nb", "\nA", "a\r", "a\x00", "a\t", "x" * 129, "", "-a", "é"])
def test_an_id_is_matched_in_full_on_every_surface(bad: str) -> None:
    from arbiterd.core.names import valid_alloc_id, valid_instance_id
    from libcgpu_client.env import EnvError, parse_env

    with pytest.raises(SettingError):
        valid_instance_id(bad)
    with pytest.raises(SettingError):
        valid_alloc_id(bad)
    with pytest.raises(SettingError):
        IdentityResolver("declared").identify(Peer(1, 0), bad)
    if bad:  # an empty variable is an unset one
        with pytest.raises(EnvError):
            parse_env({"CGPU_INSTANCE": bad})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a cgroup to another user")
def test_a_cgroup_named_after_a_container_counts_only_if_root_made_it(tmp_path: Path) -> None:
    """A user to whom a cgroup subtree is delegated (systemd's user@<uid>.service) can make a cgroup named after
    any container and move into it. Such a cgroup, owned by that user, does not make its process the container."""
    delegated = "/user.slice/user-1000.slice/user@1000.service"
    root = fake_proc(tmp_path, ME, f"0::{delegated}/app.slice/docker-{CID}.scope")
    fs = tmp_path.parent / f"{tmp_path.name}-cgroupfs" / "unified"
    for d in (delegated, f"{delegated}/app.slice", f"{delegated}/app.slice/docker-{CID}.scope"):
        os.chown(fs / d.lstrip("/"), 1000, 1000)
    r = IdentityResolver("cgroup", root)
    peer = r.peer(ME, 1000)
    assert peer.container is None and peer.tenant == "uid-1000"  # a host process of uid 1000
    with pytest.raises(IdentityError, match="not in a container"):
        r.identify(peer, CID[:12])


def test_a_container_cgroup_must_be_in_a_mounted_hierarchy(tmp_path: Path) -> None:
    """A line naming a hierarchy the daemon cannot see is no proof: the process is not taken for a container."""
    root = fake_proc(tmp_path, ME, f"0::/system.slice/docker-{CID}.scope")
    (tmp_path / "self" / "mountinfo").write_text("")  # no cgroup mount at all
    assert IdentityResolver("cgroup", root).peer(ME, 0).container is None


OTHER = "d" * 64


@pytest.mark.parametrize("inner", [f"docker/{OTHER}", f"x/docker-{OTHER}.scope", f"pod1/{OTHER}", "esc"])
@pytest.mark.parametrize("outer", [f"/system.slice/docker-{CID}.scope", f"/docker/{CID}",
                                   f"/kubepods/besteffort/pod0a1b2c3d-1111-2222-3333-444455556666/{CID}"])
def test_a_cgroup_a_container_makes_under_its_own_is_still_that_container(tmp_path: Path, outer: str,
                                                                           inner: str) -> None:
    """A container whose cgroup is writable to it can make cgroups under its own, named after another container
    (or owned by nobody), and move into them: it stays the container its outermost cgroup names, pod and all."""
    root = fake_proc(tmp_path, ME, f"0::{outer}/{inner}")
    if inner == "esc" and os.geteuid() == 0:
        os.chown(tmp_path.parent / f"{tmp_path.name}-cgroupfs" / "unified" / outer.lstrip("/") / inner, 65534, 65534)
    peer = IdentityResolver("cgroup", root).peer(ME, 0)
    assert peer.container == CID
    assert peer.pod == ("0a1b2c3d-1111-2222-3333-444455556666" if "kubepods" in outer else None)

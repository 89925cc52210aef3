"""Who a client is: its PID's cgroup under an injectable /proc, or what it declares where that is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiterd.core.errors import IdentityError, SettingError
from arbiterd.server.identity import IdentityResolver, container_id_from_cgroup

CID = "0123456789ab" + "c" * 52


@pytest.mark.parametrize("line", [
    f"0::/system.slice/docker-{CID}.scope",
    f"12:memory:/docker/{CID}",
    f"0::/kubepods.slice/kubepods-pod1234.slice/cri-containerd-{CID}.scope",
    f"0::/kubepods/besteffort/pod0a1b2c3d-1111-2222-3333-444455556666/{CID}",
    f"0::/machine.slice/libpod-{CID}.scope",
    f"0::/system.slice/crio-{CID}.scope",
])
def test_container_id_in_every_runtime_form(line: str) -> None:
    assert container_id_from_cgroup(line + "\n") == CID


def test_no_container_on_a_host_cgroup() -> None:
    assert container_id_from_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n") is None


def fake_proc(root: Path, pid: int, cgroup: str) -> None:
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "cgroup").write_text(cgroup + "\n")


def test_a_containerised_process_is_its_container(tmp_path: Path) -> None:
    fake_proc(tmp_path, 42, f"0::/system.slice/docker-{CID}.scope")
    r = IdentityResolver("cgroup", str(tmp_path))
    assert r.resolve(42, None) == CID[:12]
    assert r.resolve(42, CID[:12]) == CID[:12]
    with pytest.raises(IdentityError, match="may not act as other"):
        r.resolve(42, "other")


def test_a_host_process_may_declare_an_id(tmp_path: Path) -> None:
    fake_proc(tmp_path, 43, "0::/user.slice")
    r = IdentityResolver("cgroup", str(tmp_path))
    assert r.resolve(43, "dev-1") == "dev-1"
    assert r.resolve(43, None) == "host"
    assert r.resolve(44, None) == "host"  # no /proc entry: not in a container


def test_declared_mode_trusts_the_declaration_and_checks_its_form(tmp_path: Path) -> None:
    fake_proc(tmp_path, 45, f"0::/system.slice/docker-{CID}.scope")
    r = IdentityResolver("declared", str(tmp_path))
    assert r.resolve(45, "anything") == "anything"
    assert r.resolve(45, None) == "pid-45"
    with pytest.raises(SettingError):
        r.resolve(45, "../etc")

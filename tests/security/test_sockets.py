"""A daemon started by hand takes nothing another user prepared: its sockets, directories and token are its own."""

from __future__ import annotations

import grp
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from arbiterd.server.sockets import StartupError, bind_unix, load_token, secure_dir
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import tool
from tests.security.conftest import NOBODY, Cast, needs_root


def _cgpu_gid() -> int | None:
    try:
        return grp.getgrnam("cgpu").gr_gid
    except KeyError:
        return None


def test_the_client_socket_is_0660_and_not_for_every_user(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB")
    st = os.stat(d.sock)
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_uid == os.geteuid()
    gid = _cgpu_gid()
    if gid is None:
        assert st.st_gid == os.getegid()
        said = [line for line in d.read_log().splitlines() if "there is no group cgpu" in line]
        assert len(said) == 1 and "only root may connect" in said[0]
    else:
        assert st.st_gid == gid
    assert stat.S_IMODE(os.stat(d.admin).st_mode) == 0o600


@needs_root
def test_a_host_user_outside_the_group_cannot_connect(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB")
    outsider = cast.agent(d, uid=NOBODY)
    reply = outsider.call("connect")
    assert "PermissionError" in reply.get("error", ""), reply


@needs_root
def test_a_wider_mode_and_another_group_are_taken_when_asked_for(cast: Cast) -> None:
    group = grp.getgrgid(NOBODY).gr_name if NOBODY in {g.gr_gid for g in grp.getgrall()} else None
    if group is None:
        pytest.skip("no group with gid 65534 on this host")
    d = cast.daemon("--sim-gpus", "1x1GiB", "--socket-group", group)
    assert os.stat(d.sock).st_gid == NOBODY
    d.stop()
    d = cast.daemon("--sim-gpus", "1x1GiB", "--client-mode", "0666", sub="wide")
    assert stat.S_IMODE(os.stat(d.sock).st_mode) == 0o666
    assert "lets every local user connect" in d.read_log()
    assert cast.agent(d, uid=NOBODY).call("connect") == {"ok": True}


def test_a_missing_group_that_was_asked_for_stops_the_start(short_tmp: Path) -> None:
    r = subprocess.run([tool("arbiterd"), "--run-dir", str(short_tmp / "run"), "--state-dir", str(short_tmp / "st"),
                        "--sim-gpus", "1x1GiB", "--socket-group", "no-such-group-xyz"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 1 and "socket_group: there is no group no-such-group-xyz" in r.stderr


def test_modes_are_set_through_the_descriptor_and_a_symlink_is_never_followed(tmp_path: Path) -> None:
    """bind() creates the file with no permissions; its mode is then set on the file itself. A symlink put at the
    socket's path (stale-socket cleanup removes the link, never its target) leaves the target as it was."""
    target = tmp_path / "precious"
    target.write_text("x")
    os.chmod(target, 0o600)
    path = tmp_path / "arbiter.sock"
    path.symlink_to(target)
    sock = bind_unix(path, 0o660, None)
    try:
        assert stat.S_IMODE(target.stat().st_mode) == 0o600 and target.read_text() == "x"
        assert stat.S_ISSOCK(os.lstat(path).st_mode) and stat.S_IMODE(os.lstat(path).st_mode) == 0o660
    finally:
        sock.close()
    from arbiterd.server.sockets import set_owner_mode

    path.unlink()
    path.symlink_to(target)
    with pytest.raises(OSError):
        set_owner_mode(path, 0o666, None)  # O_NOFOLLOW: the link is refused, the target untouched
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@needs_root
@pytest.mark.parametrize(("which", "how"), [("run", "owned"), ("state", "owned"), ("run", "0777"),
                                            ("state", "0777"), ("parent", "owned")])
def test_a_directory_another_user_could_change_stops_the_start(short_tmp: Path, which: str, how: str) -> None:
    """sshd's StrictModes: a run or state dir (or one above it) owned by another non-root user, or writable by
    every user without the sticky bit, is refused with one line naming it and its owner."""
    base = short_tmp / "base"
    base.mkdir(mode=0o755)
    run, state = base / "run", base / "state"
    run.mkdir(mode=0o755)
    state.mkdir(mode=0o700)
    victim = {"run": run, "state": state, "parent": base}[which]
    if how == "owned":
        os.chown(victim, NOBODY, NOBODY)
    else:
        os.chmod(victim, 0o777)
    r = subprocess.run([tool("arbiterd"), "--run-dir", str(run), "--state-dir", str(state), "--sim-gpus", "1x1GiB"],
                       capture_output=True, text=True, timeout=30)
    lines = [line for line in r.stderr.splitlines() if "cannot start" in line]
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert str(victim) in lines[0]
    assert ("nobody" in lines[0] or f"uid {NOBODY}" in lines[0]) if how == "owned" else "any user" in lines[0]
    assert not (run / "arbiter.sock").exists()


def test_a_world_writable_sticky_directory_is_allowed(tmp_path: Path) -> None:
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    secure_dir(sticky / "run", 0o755, "run dir")
    assert (sticky / "run").is_dir()


@needs_root
def test_a_token_another_user_planted_or_can_read_is_refused(tmp_path: Path) -> None:
    token = tmp_path / "admin.token"
    token.write_text("planted\n")
    os.chown(token, NOBODY, NOBODY)
    os.chmod(token, 0o600)
    with pytest.raises(StartupError, match=r"nobody|uid 65534"):
        load_token(token)
    os.chown(token, 0, 0)
    os.chmod(token, 0o644)
    with pytest.raises(StartupError, match="0644"):
        load_token(token)
    os.chmod(token, 0o600)
    assert load_token(token) == "planted"
    token.unlink()
    made = load_token(token)
    assert len(made) == 64 and stat.S_IMODE(token.stat().st_mode) == 0o600


@needs_root
def test_a_planted_token_stops_a_daemon_that_would_serve_it(cast: Cast) -> None:
    state = cast.tmp / "d" / "state"
    state.mkdir(parents=True, mode=0o700)
    token = state / "admin.token"
    token.write_text("0" * 64)
    os.chown(token, NOBODY, NOBODY)
    d = DaemonProc(cast.tmp / "d", "--sim-gpus", "1x1GiB", "--admin-listen", "127.0.0.1:0")
    with pytest.raises(RuntimeError, match="a token another user planted"):
        d.start()


def test_peer_credentials_come_from_the_kernel() -> None:
    """The pid and uid a connection is judged by are SO_PEERCRED's, taken when it connected."""
    from arbiterd.server.connection import peer_credentials

    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        assert peer_credentials(a) == (os.getpid(), os.geteuid(), os.getegid())
    finally:
        a.close()
        b.close()
    assert sys.platform.startswith("linux")


@needs_root
def test_a_container_cannot_use_the_admin_socket_the_host_can(cast: Cast) -> None:
    """The plugins mount the socket directory into every container they set up, admin.sock with it; a tenant
    running as root (the same uid as the daemon) still may not administer it. (The admin gate reads the host's
    /proc: the agent must be in a real container cgroup, which needs root.)"""
    d = cast.daemon("--sim-gpus", "1x1GiB")
    tenant = cast.agent(d, cid=cast.containers.new_id())
    reply = tenant.call("admin_get", sock=d.admin, path="/v1/tree/inst_ctl")
    assert reply["status"] == 403, reply
    assert reply["body"].startswith("admin API refused: pid ") and "is in container" in reply["body"], reply
    host = cast.agent(d)
    assert host.call("admin_get", sock=d.admin, path="/v1/status")["status"] == 200

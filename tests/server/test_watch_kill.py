"""The watcher's edge: a kill goes through a pidfd, once the process's start time says it is still the one the core
meant, never to the daemon itself, nothing outside the host's pid namespace; a managed process's instance and the
memory limit of an instance without a record."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from arbiterd.core.containment import Containment, Kill
from arbiterd.server import watch
from arbiterd.server.hub import Hub
from arbiterd.server.identity import IdentityResolver, start_time


def watcher() -> watch.Watcher:
    return watch.Watcher(mock.Mock(), IdentityResolver(), Containment(), lambda now: {}, lambda g, i: None,
                         lambda g: None, lambda: None)


def test_a_kill_meant_for_an_earlier_process_with_the_pid_is_not_carried_out(sleeper: subprocess.Popen[bytes]) -> None:
    w = watcher()
    started = start_time(sleeper.pid)
    assert started is not None
    w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", started - 1))  # the pid now belongs to another
    assert sleeper.poll() is None and w.containment.kills.total() == 0
    w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", started))
    assert sleeper.wait(5) == -9 and w.containment.kills.total() == 1


def test_the_daemon_never_kills_itself_and_outside_the_host_pid_namespace_kills_nothing(
        sleeper: subprocess.Popen[bytes], caplog: pytest.LogCaptureFixture) -> None:
    w = watcher()
    w.kill(Kill(0, os.getpid(), "x", "unmanaged", "test", start_time(os.getpid())))
    assert w.containment.kills.total() == 0
    with mock.patch("os.readlink", return_value="pid:[4026532999]"):
        w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", start_time(sleeper.pid)))
        w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", start_time(sleeper.pid)))
    assert sleeper.poll() is None and caplog.text.count("not in the host's pid namespace") == 1
    assert Path("/proc/self/ns/pid").exists()


def test_a_managed_process_is_its_connection_s_instance() -> None:
    me = os.getpid()
    w = watcher()
    assert w.describe(me, 1, {(me, start_time(me)): "named"}, ()).instance == "named"
    assert w.describe(me, 1, {(me, start_time(me)): None}, ()).managed  # connected lately, not registered
    assert not w.describe(me, 1, {(me, 1): "named"}, ()).managed  # an earlier process with its pid


def test_an_instance_without_a_record_is_held_to_default_memsize_else_the_device(hub: Hub) -> None:
    w = hub.watch(mock.Mock())
    assert w.limit(0, "nobody") == 16 << 30
    hub.arbiter.set_global("default_memsize", 1 << 30)
    assert w.limit(0, "nobody") == 1 << 30


def test_an_executable_on_the_allow_list_exempts_a_root_run_host_process_of_a_root_owned_file_only(
        tmp_path: Path) -> None:
    """LD_PRELOAD=evil.so /usr/bin/nv-hostengine, run by any user, is that executable: it is exempt only run by
    root from a file only root may write."""
    entries = ("/usr/bin/nv-hostengine",)
    assert watch.exempt(entries, "/usr/bin/nv-hostengine", [], False, root_run=True)
    assert not watch.exempt(entries, "/usr/bin/nv-hostengine", [], False, root_run=False)
    assert not watch.exempt(entries, "/usr/bin/nv-hostengine", [], True, root_run=True)
    me = Path(f"/proc/{os.getpid()}")
    assert watch.root_run(me) == (os.geteuid() == 0 and os.stat(me / "exe").st_uid == 0
                                  and not os.stat(me / "exe").st_mode & 0o022)
    loose = tmp_path / "exe"
    loose.write_text("")
    loose.chmod(0o777)
    fake = tmp_path / "proc"
    fake.mkdir()
    (fake / "exe").symlink_to(loose)
    assert not watch.root_run(fake)  # written by anyone


def test_the_record_of_recent_clients_is_pruned_by_time_with_or_without_a_watcher() -> None:
    """Each process that registered is remembered CLIENT_GRACE_NS after its last registered connection closed;
    the daemon prunes every second (before: only NVML's poll pruned, so without one about 220 B stayed behind
    for every client pid ever seen)."""
    from arbiterd.server.watch import CLIENT_GRACE_NS, RecentClients

    recent = RecentClients()
    for pid in range(1000, 6000):
        recent.saw(pid, pid, now=0)
    recent.saw(1, 7, now=CLIENT_GRACE_NS)
    recent.prune(CLIENT_GRACE_NS)
    assert len(recent.seen) == 5001  # all still within the grace
    recent.prune(CLIENT_GRACE_NS + 1)
    assert recent.seen == {(1, 7): CLIENT_GRACE_NS}

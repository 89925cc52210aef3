"""How the watcher carries out a kill: through a pidfd, once the process's start time says it is still the one the
core meant; never the daemon itself; nothing outside the host's pid namespace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from unittest import mock

import pytest

from arbiterd.core.containment import Containment, Kill
from arbiterd.server import watch
from arbiterd.server.identity import IdentityResolver, start_time


def watcher() -> watch.Watcher:
    return watch.Watcher(mock.Mock(), IdentityResolver(), Containment(), lambda now: set(), lambda g, i: None,
                         lambda g: None, lambda: None)


@pytest.fixture
def sleeper() -> subprocess.Popen[bytes]:
    p = subprocess.Popen(["sleep", "60"])
    yield p  # type: ignore[misc]
    p.kill()
    p.wait()


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
    with mock.patch.object(watch.os, "readlink", return_value="pid:[4026532999]"):
        w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", start_time(sleeper.pid)))
        w.kill(Kill(0, sleeper.pid, "x", "unmanaged", "test", start_time(sleeper.pid)))
    assert sleeper.poll() is None and caplog.text.count("not in the host's pid namespace") == 1
    assert Path("/proc/self/ns/pid").exists()

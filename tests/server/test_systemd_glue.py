"""sd_notify and LISTEN_FDS, in process."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from arbiterd.server.systemd import Notifier, listen_fds


def test_notifier_sends_datagrams_to_notify_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    n = Notifier({"NOTIFY_SOCKET": path})
    n.send("READY=1", "STATUS=ok")
    assert sock.recv(1024) == b"READY=1\nSTATUS=ok"
    n.close()
    sock.close()


def test_notifier_without_socket_does_nothing_and_reads_the_watchdog() -> None:
    Notifier({}).send("READY=1")
    assert Notifier({"WATCHDOG_USEC": "400000"}).watchdog_usec == 400000
    assert Notifier({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"}).watchdog_usec == (400000 if os.getpid() == 1
                                                                                         else 0)


def test_listen_fds_for_another_process_or_malformed_are_ignored() -> None:
    assert listen_fds({"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "2"}) == {}
    assert listen_fds({"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "two"}) == {}

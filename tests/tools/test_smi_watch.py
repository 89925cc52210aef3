"""``cgpu-smi -l``: in place on a terminal (read back with tmux), plain blocks when piped."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import tool


@pytest.fixture
def daemon(daemon_factory: type) -> DaemonProc:
    return daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared")  # type: ignore[no-any-return]


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_watch_refreshes_in_place_on_a_terminal(daemon: DaemonProc, short_tmp: Path) -> None:
    server = f"cgpu-test-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-L", server, "-f", "/dev/null"]
    subprocess.run([*tmux, "new-session", "-d", "-x", "220", "-y", "40", "-s", "smi",
                    f"{tool('cgpu-smi')} --admin {daemon.admin} -l 1; sleep 30"], check=True, timeout=10)
    try:
        def screen() -> str:
            return subprocess.run([*tmux, "capture-pane", "-p", "-t", "smi"], capture_output=True, text=True,
                                  check=True, timeout=10).stdout

        deadline = time.monotonic() + 15
        while "Entitled% 1s" not in (first := screen()):
            assert time.monotonic() < deadline, first
            time.sleep(0.2)
        time.sleep(2.2)
        second = screen()
        for shot in (first, second):
            assert shot.count("Entitled% 1s") == 1 and shot.count("cgpu-smi ") == 1, shot  # one table, not a scroll
        assert first.splitlines()[0] != second.splitlines()[0]  # the clock line moved: it was redrawn
        assert second.splitlines()[0].strip() and "Entitled% 1s" in second
    finally:
        subprocess.run([*tmux, "kill-server"], timeout=10, check=False)


def test_watch_prints_plain_blocks_when_piped(daemon: DaemonProc) -> None:
    proc = subprocess.Popen([tool("cgpu-smi"), "--admin", daemon.admin, "--watch", "0.3"], stdout=subprocess.PIPE,
                            text=True)
    time.sleep(1.5)
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    assert "\x1b" not in out
    assert out.count("Entitled% 1s") >= 3
    assert out.count("\n\n") >= 3  # blocks, one after the other


def test_watch_with_json_prints_one_document_a_line(daemon: DaemonProc) -> None:
    import json

    proc = subprocess.Popen([tool("cgpu-smi"), "--admin", daemon.admin, "-l", "0.3", "--json"],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(1.2)
    proc.terminate()
    out, _ = proc.communicate(timeout=10)
    docs = [json.loads(line) for line in out.splitlines()]
    assert len(docs) >= 2 and all(d["schema"] == 1 for d in docs)

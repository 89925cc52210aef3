"""Where the harness finds things: the checkout's root and the console scripts installed beside this Python."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def tool(name: str) -> str:
    """Path of a console script installed beside this Python (arbiterd, cgpuctl, cgpu-run, ...)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def root_on_path(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) with the checkout's root first on ``PYTHONPATH``, so that a
    child started from elsewhere imports ``cgpu_testing`` and ``bench`` (which ``pip install`` leaves out)."""
    base = dict(os.environ if env is None else env)
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), base.get("PYTHONPATH")]))
    return base


def still_open(s: socket.socket) -> bool:
    """Whether the peer has not closed ``s``, on which it sent nothing (a read that returns is the close)."""
    s.setblocking(False)
    try:
        return s.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False

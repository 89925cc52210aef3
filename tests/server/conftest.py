from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from arbiterd.server.config import Config
from arbiterd.server.devices import parse_sim_gpus
from arbiterd.server.hub import Hub
from arbiterd.server.persist import StateStore


@pytest.fixture
def hub(tmp_path: Path) -> Hub:
    """A hub on two simulated GPUs, its state in a temporary dir (no sockets, no event loop)."""
    cfg = Config(sim_gpus="2x16GiB", identity="declared", state_dir=str(tmp_path))
    return Hub(cfg, parse_sim_gpus("2x16GiB"), StateStore(str(tmp_path)))


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A process that sits still for a minute (what the fake NVML lists as a GPU tenant); killed afterwards."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()

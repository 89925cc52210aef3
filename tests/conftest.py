from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from cgpu_testing.daemon import DaemonProc

# Property tests judge the code, not this machine's pace: no per-example deadline and no "generation is slow"
# health check (the first text strategy of a fresh checkout spends a second building hypothesis's character
# tables, and a noisy 2-core machine stalls for as long). pytest-timeout still catches a test that hangs.
settings.register_profile("cgpu", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cgpu")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary dir (UNIX socket paths must stay under 108 bytes), removed after the test."""
    path = Path(tempfile.mkdtemp(prefix="cg-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def daemon_factory(short_tmp: Path) -> Iterator[type]:
    started: list[DaemonProc] = []

    class Factory:
        @staticmethod
        def start(*args: str, sub: str = "d", **kw: object) -> DaemonProc:
            d = DaemonProc(short_tmp / sub, *args, **kw)  # type: ignore[arg-type]
            started.append(d)
            return d.start()

    yield Factory
    for d in started:
        if d.running():
            d.stop()

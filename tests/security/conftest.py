"""The hostile suite's cast: daemons started by hand, tenants and attackers in processes of their own
(cgpu_testing/cast.py).

Attackers on the host run as ``nobody`` where the tests run as root (CI does); container processes are put in
real container cgroups when the tests run as root, else in a fake ``/proc``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cgpu_testing.cast import Cast
from cgpu_testing.containers import IS_ROOT, NOBODY

__all__ = ["NOBODY", "Cast", "needs_root"]
needs_root = pytest.mark.skipif(not IS_ROOT, reason="needs root to act as another uid (CI runs as root)")


@pytest.fixture
def cast(short_tmp: Path) -> Iterator[Cast]:
    c = Cast(short_tmp)
    yield c
    c.cleanup()

"""bench.k8s --dra on a short sequence: the bench's wiring holds together. No pod is split (one request is one
device: this holds by construction), none is refused while one card has room for it (the scheduler model's own
first-fit accounting: the plugin prepares every claim the model places), and arbiterd never holds an overcommitted
card."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from bench.k8s import GIB_PER_GPU, GPUS, replay, workload
from bench.k8s_dra import replay_dra


def test_dra_places_every_pod_on_one_card_with_room_and_never_overcommits() -> None:
    arrivals = workload(40, 7)
    tmp = Path(tempfile.mkdtemp(prefix="bd-", dir="/tmp"))  # short: UNIX socket paths
    try:
        dra = replay_dra(arrivals, tmp / "dra", GPUS, GIB_PER_GPU)
        plugin = replay("binpack", arrivals, tmp / "binpack")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert dra.pods == 40 and dra.admitted + dra.no_card + dra.no_room + dra.refused_with_room == 40
    assert (dra.split, dra.refused_with_room, dra.overcommits) == (0, 0, 0)
    assert dra.admitted >= plugin.admitted - plugin.split  # at least as many pods run as through the plugin
    assert len(dra.prepare_ms) >= dra.admitted
    assert dra.running_at_end >= 5 and dra.labelled == dra.running_at_end, dra.label_problems
    assert plugin.running_at_end >= 5 and plugin.labelled == plugin.running_at_end, plugin.label_problems
    # requests and limits: every other claim asking cores carried a ShareConfig limit, in force in arbiterd
    assert len(dra.limited) >= 5 and dra.limits_running >= 2, dra.limited
    assert dra.limits_in_force == dra.limits_running, dra.limit_problems

"""The grant benchmarks' own logic: when a level counts as saturated, what the headline is, and that the
in-process hot-path benchmark drives the daemon's real connection objects."""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from bench import grants, hotpath


def level(clients: int, cpu_pct: float, saturated: bool, p50: float = 50.0) -> dict[str, Any]:
    return {"p50_us": p50, "p99_us": 3 * p50, "daemon_cpu_pct": cpu_pct, "saturated": saturated,
            "achieved_pairs_per_s": clients * 200}


def test_the_headline_is_the_highest_level_that_is_not_saturated() -> None:
    levels = {"1": level(1, 5.0, False, 40.0), "16": level(16, 60.0, False, 45.0),
              "32": level(32, 90.0, True, 1500.0)}
    head = grants.headline(levels)
    assert head["clients"] == 16 and head["p50_us"] == 45.0
    # 80 % lies two thirds of the way from 60 % (3,200 pairs/s) to 90 % (6,400 pairs/s)
    assert head["capacity_pairs_per_s"] == 5333
    assert not head["every_level_saturated"]


def test_capacity_is_scaled_from_the_nearest_level_when_no_two_straddle_80_percent() -> None:
    assert grants.capacity({"1": level(1, 2.0, False), "16": level(16, 40.0, False)}) == 6400
    assert grants.capacity({"32": level(32, 90.0, True), "64": level(64, 95.0, True)}) == 5689


def test_with_every_level_saturated_the_headline_says_so() -> None:
    head = grants.headline({"16": level(16, 85.0, True), "64": level(64, 95.0, True)})
    assert head["clients"] == 0 and head["every_level_saturated"]
    assert grants.summary(head).startswith("capacity_pairs_per_s=3012 unsaturated_clients=0 ")


@pytest.mark.parametrize(("achieved_share", "saturated"), [(1.0, False), (0.96, False), (0.90, True)])
def test_a_level_that_falls_behind_its_offered_load_is_saturated(achieved_share: float, saturated: bool) -> None:
    """16 clients offer 3,200 pairs/s; below 95 % of that achieved is saturation (the server here, this
    test's own process, is idle while the level sleeps, far below 80 % of a core)."""

    def run() -> dict[str, Any]:
        time.sleep(0.2)
        return {"p50_us": 40.0, "p99_us": 90.0, "samples": 100, "pairs_per_s": 3200 * achieved_share,
                "pairs_total": 640}

    res = grants.loaded(os.getpid(), 16, run)
    assert res["offered_pairs_per_s"] == 3200
    assert res["daemon_cpu_pct"] < 50
    assert res["saturated"] is saturated


def test_the_server_cpu_counts_every_thread_of_it() -> None:
    """A thread of this process spinning for the whole level is one busy core; on a loaded machine it gets less
    (beside another test worker and the machine's noise on two cores it has read 46 %), so the test asks for a
    quarter, which an idle server never reaches."""
    import threading

    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        res = grants.loaded(os.getpid(), 16, _level)
    finally:
        stop.set()
        spinner.join()
    assert res["daemon_cpu_pct"] > 25
    assert res["daemon_cpu_us_per_pair"] == pytest.approx(res["daemon_cpu_pct"] / 100 * 0.5e6 / 1600, rel=0.2)


def _level() -> dict[str, Any]:
    time.sleep(0.5)
    return {"p50_us": 40.0, "p99_us": 90.0, "samples": 100, "pairs_per_s": 3200.0, "pairs_total": 1600}


def test_a_level_whose_server_is_busy_is_saturated_whatever_it_achieves(monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that used 90 % of a core over the level is saturated although it achieved all it was offered;
    at 50 % it is not (its CPU read as wall time passes, so the rule is tested apart from the machine's load)."""
    for share, saturated in ((0.9, True), (0.5, False)):
        monkeypatch.setattr(grants, "cpu_ns", lambda pid, share=share: int(share * time.monotonic_ns()))
        res = grants.loaded(os.getpid(), 16, _level)
        assert res["achieved_pairs_per_s"] >= res["offered_pairs_per_s"]
        assert res["daemon_cpu_pct"] == pytest.approx(100 * share, abs=1)
        assert res["saturated"] is saturated


def test_hotpath_drives_the_daemons_connections_and_the_floor() -> None:
    """A short run: every acquire on the daemon's side was answered with a grant (lease_of asserts it),
    and the daemon's side costs more than the bare decode and encode."""
    doc = hotpath.measure(pairs=400, clients=16, rounds=1)
    assert doc["pair_us"] > doc["floor_us"] > 0
    assert doc["ratio"] == pytest.approx(doc["pair_us"] / doc["floor_us"], rel=0.01)

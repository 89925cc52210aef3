"""A line a client can cause is written once per key every few seconds, and the next says how many were held."""

from __future__ import annotations

import logging

import pytest

from arbiterd.server import lograte
from arbiterd.server.lograte import LogRate


def test_a_key_writes_once_a_period_and_then_counts_what_it_held_back(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    monkeypatch.setattr(lograte.time, "monotonic", lambda: now[0])
    rate = LogRate(logging.getLogger("t"), period_s=10)
    with caplog.at_level(logging.INFO, logger="t"):
        for _ in range(1000):
            rate.log("refused uid-7", logging.WARNING, "refusing client pid %d", 1)
        rate.log("refused uid-8", logging.WARNING, "refusing client pid %d", 2)  # another key: its own line
        now[0] += 10
        rate.log("refused uid-7", logging.WARNING, "refusing client pid %d", 3)
    assert [r.getMessage() for r in caplog.records] == [
        "refusing client pid 1", "refusing client pid 2",
        "refusing client pid 3 (999 more like it held back in the last 10 s)"]


def test_keys_whose_period_is_over_are_forgotten_when_there_are_many(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(lograte.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(lograte, "KEYS_MAX", 10)
    rate = LogRate(logging.getLogger("t2"), period_s=1)
    for i in range(10):
        rate.log(f"k{i}", logging.DEBUG, "x")
    now[0] = 5.0
    rate.log("new", logging.DEBUG, "x")
    assert set(rate.seen) == {"new"}

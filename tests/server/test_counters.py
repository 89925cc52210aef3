"""The daemon's counters: the grant-latency histogram keeps Prometheus' ``le`` semantics."""

from __future__ import annotations

import pytest

from arbiterd.server.counters import GRANT_LATENCY_BUCKETS, Counters


def test_grant_latency_histogram_counts_each_wait_in_its_le_bucket() -> None:
    """A wait equal to a bound is counted under that bound (``le``); past the last finite bound it lands
    in +Inf."""
    c = Counters()
    waits_ns = [0, 10_000, 10_001, 25_000, 4_000_000_000, 5_000_000_000, 7_000_000_000]
    for w in waits_ns:
        c.granted(w)
    assert c.grants_sent == len(waits_ns)
    assert c.grant_latency_sum == pytest.approx(sum(waits_ns) / 1e9)
    expect = [0] * len(GRANT_LATENCY_BUCKETS)
    for bound_index in (0, 0, 1, 1, 17, 17, 18):  # 1e-5 holds 0 and 10 us; 2.5e-5 holds 10.001 and 25 us
        expect[bound_index] += 1
    assert GRANT_LATENCY_BUCKETS[17] == 5.0 and GRANT_LATENCY_BUCKETS[18] == float("inf")
    assert c.grant_buckets == expect


def test_cumulative_buckets_end_with_every_grant() -> None:
    c = Counters()
    for w in (1, 50_000, 3_000_000):
        c.granted(w)
    cumulative = c.cumulative_buckets()
    assert [n for _, n in cumulative] == sorted(n for _, n in cumulative)
    assert cumulative[-1] == (float("inf"), 3)

"""bench.fidelity's own logic, on a virtual clock: a row's shares and ratio from the tenants' records, and the
rule that runs a noisy row for more cycles (by the spread of its cycles, never by their mean)."""

from __future__ import annotations

import argparse
import random
from types import TracebackType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench import fidelity
from bench.fidelity import ROWS, Row

RATE = 200.0  # operations per second of a tenant alone, at the machine's pace 1


class Clock:
    now = 10**9


class FakeDaemon:
    """What run_row asks of arbiterd: settings written, and a status whose books it adds up."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.settings = clock, dict[str, str]()

    def echo(self, value: str, path: str) -> None:
        self.settings[path] = value

    def status(self) -> dict[str, Any]:
        return {"uptime_seconds": self.clock.now / 1e9,
                "gpus": [{"instances": [], "slice_effective_ms": 5, "handover_ms": 1.0,
                          "handover_transit_ms": 0.5, "handover_warmup_ms": 0.5}]}


class FakeTenants:
    """Tenants whose work follows the daemon's weights exactly, on a machine whose pace moves from one phase
    to the next by ``noise`` (a standard deviation, relative)."""

    def __init__(self, daemon: FakeDaemon, row: Row, noise: float, seed: int = 1) -> None:
        self.daemon, self.row, self.noise = daemon, row, noise
        self.rand = random.Random(seed)
        self.records: dict[str, list[int]] = {t.name: [] for t in row.tenants}
        self.turns: list[tuple[int, int]] = []

    def __enter__(self) -> FakeTenants:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        pass

    def instance(self, name: str) -> str:
        return name

    def run(self, names: list[str], seconds: float) -> tuple[int, int]:
        t0 = self.daemon.clock.now
        t1 = t0 + int(seconds * 1e9)
        pace = max(0.1, self.rand.gauss(1.0, self.noise))
        weights = {n: int(self.daemon.settings.get(f"0/{n}/weight", "1")) for n in names}
        for name in names:
            per_s = RATE * pace * weights[name] / sum(weights.values())
            step = int(1e9 / per_s)
            self.records[name] += range(t0 + step, t1, step)
        if len(names) > 1:
            self.turns += [(g, g) for g in range(t0, t1, 50_000_000)]
        self.daemon.clock.now = t1 + 200_000_000
        return t0, t1

    def ends(self, name: str) -> list[int]:
        return list(self.records[name])

    def leases(self, name: str) -> list[tuple[int, int]]:
        return list(self.turns)


def args(**kw: Any) -> argparse.Namespace:
    base = {"cycles": 4, "ratio_cycles": 8, "pinned_cycles": 16, "max_cycles_factor": 2, "exclusive": 1.5,
            "contended": 6.0, "warmup": 1.0, "drift": 1000.0}
    return argparse.Namespace(**{**base, **kw})


def run(row: Row, noise: float, **kw: Any) -> dict[str, Any]:
    daemon = FakeDaemon(Clock())
    return fidelity.run_row(daemon, lambda r: FakeTenants(daemon, r, noise), row, args(**kw))  # type: ignore[arg-type]


def row(name: str) -> Row:
    return next(r for r in ROWS if r.name == name)


def test_a_steady_machine_gives_exact_shares_in_the_row_s_own_cycles() -> None:
    out = run(row("p1_two_busy"), 0.0)
    assert out["cycles"] == 4 and out["base_cycles"] == 4
    for t in out["tenants"]:
        assert abs(t["share_pct"] - 50.0) < 0.2 and t["share_se_pp"] < 0.1
    out = run(row("p2_1_2"), 0.0)
    assert out["cycles"] == 8 and abs(out["ratio"] - 2.0) < 0.01


def test_a_noisy_row_runs_more_cycles_up_to_its_factor() -> None:
    out = run(row("p1_two_busy"), 0.15)
    assert out["cycles"] == 8  # four more, and no further
    assert max(t["share_se_pp"] for t in out["tenants"]) > 1.5  # still noisy: it stopped at its cap
    assert run(row("p1_two_busy"), 0.15, max_cycles_factor=1)["cycles"] == 4


def test_a_1_2_row_grows_by_whole_abba_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found too noisy once, after its own eight cycles, a 1:2 row runs a whole ABBA block more and looks again
    only then."""
    looks: list[int] = []

    def noisy_once(by_role: dict[str, list[float]], log_ratios: list[float]) -> bool:
        looks.append(len(log_ratios))
        return len(looks) == 1

    monkeypatch.setattr(fidelity, "too_noisy", noisy_once)
    out = run(row("p2_1_2"), 0.0, max_cycles_factor=3)
    assert out["cycles"] == 12 and looks == [8, 12]
    assert len(out["cycles_ratio"]) == 12
    assert abs(out["ratio"] - 2.0) < 0.01  # the block kept the ABBA balance


@given(st.floats(0.0, 4.0), st.floats(0.0, 4.0), st.floats(0.0, 3.0))
def test_too_noisy_is_half_the_target(share_se: float, other_se: float, ratio_se_pct: float) -> None:
    """Samples built to a given standard error: two values d apart have a standard error of d / 2."""
    by_role = {"A": [50.0, 50.0 + 2 * share_se], "B": [50.0, 50.0 + 2 * other_se]}
    d = 2 * ratio_se_pct / 100
    noisy = fidelity.too_noisy(by_role, [0.7, 0.7 + d])
    assert noisy == (max(share_se, other_se) > 1.5 + 1e-9 or ratio_se_pct > 1.25 + 1e-9) or \
        min(abs(max(share_se, other_se) - 1.5), abs(ratio_se_pct - 1.25)) < 1e-6


@given(st.lists(st.integers(0, 10**6), max_size=200), st.integers(0, 10**6), st.integers(1, 10**6))
def test_rate_counts_the_ends_in_its_window(ends: list[int], t0: int, span: int) -> None:
    ends.sort()
    t1 = t0 + span
    assert fidelity.rate(ends, t0, t1) == sum(1 for t in ends if t0 <= t < t1) / (span / 1e9)


def test_only_names_rows_exactly_or_by_part() -> None:
    chosen = [r.name for r in ROWS if fidelity.selected(r, "p2_1_2,hp60")]
    assert chosen == ["p2_1_2", "hp60_beside_normal"]  # p2_1_2 names a row: not p2_1_2_b_idle nor the pinned one
    assert [r.name for r in ROWS if fidelity.selected(r, "b_idle")] == ["p2_1_2_b_idle", "p4_b_idle"]
    assert all(fidelity.selected(r, None) for r in ROWS)


def test_the_high_priority_gap_pairs_rows_of_one_size_and_workload() -> None:
    def row(name: str, size: float, workload: str, agg: float) -> dict[str, object]:
        return {"row": name, "size_ms": size, "workload": workload, "aggregate_pct": agg}

    rows = [row("p2_1_2", 0.5, "loop", 96.0), row("hp60_beside_normal", 0.5, "loop", 95.5),
            row("p2_1_2", 0.5, "sync", 96.0), row("hp60_beside_normal", 0.5, "sync", 94.0),
            row("hp60_beside_normal", 5, "sync", 80.0)]  # no 1:2 row of its own to compare with
    assert fidelity.hp_gap(rows) == 2.0
    assert fidelity.hp_gap(rows[:2]) == 0.5
    assert fidelity.hp_gap(rows[4:]) == 0.0
    assert {r.name for r in ROWS if r.sync} == set(fidelity.HP_PAIR)


def test_the_delivered_gap_compares_the_daemon_s_useful_time_not_the_tenants_throughput() -> None:
    """The 1:2 pair got 95.0 % of the time as useful, high priority 95.6 %: the daemon spent no more on its
    preemptions (gap -0.6 pp) while the throughput gap, which the tenants' speed in their turns moves, reads 4."""
    def row(name: str, agg: float, delivered: tuple[float, float]) -> dict[str, object]:
        return {"row": name, "size_ms": 0.5, "workload": "loop", "aggregate_pct": agg,
                "tenants": [{"daemon_delivered_pct": d} for d in delivered]}

    rows = [row("p2_1_2", 97.0, (31.5, 63.5)), row("hp60_beside_normal", 93.0, (57.6, 38.0))]
    assert fidelity.hp_gap(rows) == 4.0
    assert abs(fidelity.hp_gap(rows, fidelity.delivered) - -0.6) < 1e-9
    assert "time delivered, 1:2 less high priority: -0.60 pp" in fidelity.noise(
        [{**r, "pinned": False, "ratio_se_pct": 0.0, "tenants": [{**t, "share_se_pp": 0.0} for t in r["tenants"]]}
         for r in rows])


def test_the_compared_rows_take_turns_cycle_by_cycle_each_under_its_own_settings() -> None:
    """run_side_by_side: one pair of processes plays both rows. While both rows have cycles left their contended
    runs alternate, each under its own row's policy, prio_ratio, weights and priorities, with the tenants alone
    just before under the same row's settings; the 1:2 row's last four cycles (8 against 4) follow on their own."""
    daemon = FakeDaemon(Clock())
    log: list[tuple[str, dict[str, str]]] = []  # (what ran, the settings in force) per phase

    class Logged(FakeTenants):
        def run(self, names: list[str], seconds: float) -> tuple[int, int]:
            log.append(("together" if len(names) > 1 else "alone", dict(self.daemon.settings)))
            return super().run(names, seconds)

    tenants: list[Logged] = []

    def tenants_of(r: Row) -> Logged:
        tenants.append(Logged(daemon, r, 0.0))
        return tenants[-1]

    outs = fidelity.run_side_by_side(daemon, tenants_of, [row(n) for n in fidelity.HP_PAIR], args())  # type: ignore[arg-type]
    assert len(tenants) == 1  # the same processes played the high-priority row's H and N
    together = [(i, s) for i, (what, s) in enumerate(log) if what == "together"]
    assert [s["0/policy"] for _, s in together] == ["2", "1"] * 4 + ["2"] * 4
    for i, s in together:
        mine = {k: s[k] for k in ("0/prio_ratio", "0/A/highprio", "0/B/highprio")}
        if s["0/policy"] == "1":
            assert mine == {"0/prio_ratio": "60", "0/A/highprio": "1", "0/B/highprio": "0"}
            assert (s["0/A/weight"], s["0/B/weight"]) == ("1", "1")
        else:
            assert mine == {"0/prio_ratio": "50", "0/A/highprio": "0", "0/B/highprio": "0"}
            assert {s["0/A/weight"], s["0/B/weight"]} == {"1", "2"}
        before = log[i - 2:i]  # each tenant alone, under this row's settings
        assert [w for w, _ in before] == ["alone"] * 2
        assert all(b["0/prio_ratio"] == s["0/prio_ratio"] and b["0/A/highprio"] == s["0/A/highprio"]
                   for _, b in before)
    assert [o["row"] for o in outs] == list(fidelity.HP_PAIR) and [o["cycles"] for o in outs] == [8, 4]
    assert abs(outs[0]["ratio"] - 2.0) < 0.01
    assert [t["name"] for t in outs[1]["tenants"]] == ["H", "N"]
    assert all(abs(t["share_pct"] - 50.0) < 0.2 for t in outs[1]["tenants"])  # the fake splits by weight: 1:1


def test_a_row_s_settings_are_in_force_before_its_tenants_start() -> None:
    """Tenants register as they start: p2_3_5_7's (weights 3, 5, 7) start under the defaults' max_inst 16, not
    under the 10 that p3_max10_w3_alone, the row before, left in the tree (which refuses the third)."""
    daemon = FakeDaemon(Clock())
    seen: dict[str, dict[str, str]] = {}

    class Registering(FakeTenants):
        def __enter__(self) -> Registering:
            seen[self.row.name] = dict(self.daemon.settings)
            return self

    for name in ("p3_max10_w3_alone", "p2_3_5_7"):
        fidelity.run_row(daemon, lambda r: Registering(daemon, r, 0.0), row(name), args())  # type: ignore[arg-type]
    assert seen["p3_max10_w3_alone"]["0/max_inst"] == "10"
    assert seen["p2_3_5_7"]["0/max_inst"] == "16"
    assert sum(t.weight for t in row("p2_3_5_7").tenants) <= int(seen["p2_3_5_7"]["0/max_inst"])
    pair = [row(n) for n in fidelity.HP_PAIR]
    daemon.settings["0/prio_ratio"] = "10"
    fidelity.run_side_by_side(daemon, lambda r: Registering(daemon, r, 0.0), pair, args())  # type: ignore[arg-type]
    assert seen[pair[0].name]["0/prio_ratio"] == "50"

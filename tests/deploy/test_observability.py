"""deploy/prometheus and deploy/grafana: the rules check and pass their unit tests, the live metrics pass
``promtool check metrics``, the starvation alert fires on series a real daemon produced, and the dashboard
asks only for metrics the daemon exports.

promtool comes with Debian's ``prometheus`` package, which ``.ci/run`` installs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.tools.adminclient import AdminClient
from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT

RULES = ROOT / "deploy" / "prometheus" / "cgpu-rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "cgpu.json"
PHASES = ROOT / "tests" / "workloads" / "gate_phases.py"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (.ci/run installs "
                                                               "Debian's prometheus package)")
STARVED = ("entitled", "demand", "delivered")


def promtool(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=120, cwd=cwd)


@dataclass
class Scrapes:
    first: str
    second: str
    seconds: float  # between them


@pytest.fixture(scope="module")
def live() -> Iterator[Scrapes]:
    """GPU 0: two busy tenants at 1:2. GPU 1 (max_inst 1): S busy, Z registered after it with weight 0."""
    import tempfile

    d = DaemonProc(Path(tempfile.mkdtemp(prefix="ob-", dir="/tmp")) / "d", "--sim-gpus", "2x16GiB",
                   "--identity", "declared", "--overcommit", "queue")
    d.tmp.mkdir()
    d.start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        d.ctl("echo", "1", "1/max_inst")
        admin = AdminClient(d.admin)

        def tenant(name: str, weight: int, gpu: int) -> None:
            procs.append(subprocess.Popen([sys.executable, str(PHASES), d.sock, name, str(weight), "busy:8"],
                                          env={**os.environ, "GATE_GPU": str(gpu)}))
            deadline = time.monotonic() + 15
            while not any(i["id"] == name for g in admin.status()["gpus"] for i in g["instances"]):
                assert time.monotonic() < deadline, f"{name} did not register"
                time.sleep(0.05)

        for name, weight, gpu in (("A", 1, 0), ("B", 2, 0), ("S", 1, 1), ("Z", 1, 1)):
            tenant(name, weight, gpu)
        time.sleep(2.0)
        t1, first = time.monotonic(), admin.request("GET", "/metrics")
        time.sleep(3.0)
        t2, second = time.monotonic(), admin.request("GET", "/metrics")
        yield Scrapes(first, second, t2 - t1)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        d.stop()
        shutil.rmtree(d.tmp.parent, ignore_errors=True)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def value(text: str, name: str, **labels: str) -> float:
    """The one sample of ``name`` whose labels include ``labels``."""
    (found,) = [v for (n, have), v in samples(text).items() if n == name and set(labels.items()) <= set(have)]
    return found


@needs_promtool
def test_the_rules_check() -> None:
    out = promtool("check", "rules", str(RULES))
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_the_rules_pass_their_unit_tests() -> None:
    out = promtool("test", "rules", "cgpu-rules.test.yml", cwd=RULES.parent)
    assert out.returncode == 0, out.stdout + out.stderr


@needs_promtool
def test_live_metrics_pass_promtool_check_metrics(live: Scrapes) -> None:
    """promtool finds nothing but the two label names dcgm-exporter chose (``UUID``, ``modelName``: not snake_case,
    kept so that dashboards built for dcgm-exporter join on them), on the per-instance series that carry them; with
    those two labels taken out, nothing at all."""
    out = promtool("check", "metrics", stdin=live.second)
    lint = sorted(set((out.stdout + out.stderr).splitlines()))
    per_instance = sorted({s.name for f in text_string_to_metric_families(live.second) for s in f.samples
                           if "modelName" in s.labels})
    assert per_instance and all(n.startswith("cgpu_instance_") for n in per_instance)
    assert lint == [f"{n} label names should be written in 'snake_case' not 'camelCase'" for n in per_instance]
    stripped = re.sub(r'(UUID|modelName)="[^"]*",?', "", live.second).replace(",}", "}")
    out = promtool("check", "metrics", stdin=stripped)
    assert out.returncode == 0 and out.stdout + out.stderr == "", out.stdout + out.stderr


def test_the_daemon_itself_says_z_is_starved(live: Scrapes) -> None:
    rate = {(n, k): (value(live.second, f"cgpu_instance_{k}_seconds_total", gpu="1", instance=n)
                     - value(live.first, f"cgpu_instance_{k}_seconds_total", gpu="1", instance=n)) / live.seconds
            for n in "SZ" for k in STARVED}
    assert rate[("Z", "entitled")] == pytest.approx(0.5, abs=0.02)  # what weight 1 of 1 + 1 would give it
    assert rate[("Z", "demand")] == pytest.approx(1.0, abs=0.02) and rate[("Z", "delivered")] == 0.0
    assert rate[("S", "delivered")] > 0.9
    assert value(live.second, "cgpu_instance_weight", gpu="1", instance="Z") == 0


@needs_promtool
def test_the_starvation_alert_fires_on_the_series_the_daemon_produced(live: Scrapes, tmp_path: Path) -> None:
    """The two scrapes' values and slopes, per 30 s evaluation step, as promtool input series: Z fires, S not."""
    series = []
    slope = {}
    for name in "SZ":
        for kind in STARVED:
            metric = f"cgpu_instance_{kind}_seconds_total"
            v1 = value(live.first, metric, gpu="1", instance=name)
            # the measured slope to 4 significant digits, as the alert prints it: at a slope of 0.49935 the
            # expected "49.93" and promtool's own arithmetic ("49.94") rounded a tie apart
            rate = float(f"{(value(live.second, metric, gpu='1', instance=name) - v1) / live.seconds:.4g}")
            slope[(name, kind)] = rate  # what promtool's rate() will see
            step = round(30 * rate, 6)
            series.append({"series": f'{metric}{{job="cgpu", gpu="1", instance="{name}"}}',
                           "values": f"{v1:.6f}+{step:.6f}x12"})
    test = {"rule_files": [str(RULES)], "evaluation_interval": "30s",
            "tests": [{"interval": "30s", "input_series": series, "alert_rule_test": [
                {"eval_time": "1m", "alertname": "CgpuInstanceStarved", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "CgpuInstanceStarved", "exp_alerts": [
                    {"exp_labels": {"severity": "critical", "job": "cgpu", "gpu": "1", "instance": "Z"},
                     "exp_annotations": {
                         "summary": "instance Z on GPU 1 gets no GPU time",
                         "description": f"It is entitled to {100 * slope[('Z', 'entitled')]:.4g}% of GPU 1's "
                                        "time and wants it, but has been "
                                        "delivered none for 2 minutes. Check `cgpu-smi` (weight 0 shows as "
                                        "STARVED) and free_weight."}}]}]}]}
    path = tmp_path / "starved.test.yml"
    path.write_text(json.dumps(test))  # JSON is YAML
    out = promtool("test", "rules", str(path))
    assert out.returncode == 0, out.stdout + out.stderr + path.read_text()


def test_the_dashboard_asks_only_for_exported_metrics(live: Scrapes) -> None:
    dash = json.loads(DASHBOARD.read_text())
    exported = {name for name, _ in samples(live.second)}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bcgpu_[a-z0-9_]+", e)}
    assert used and used <= exported, used - exported
    titles = {p["title"] for p in dash["panels"]}
    assert {"GPU busy", "Policy", "Entitled vs delivered", "Fairness error", "Grant latency",
            "Overruns and revocations by reason", "Memory used vs limit"} <= titles
    assert all(p["datasource"]["uid"] == "${datasource}" for p in dash["panels"])
    heat = next(p for p in dash["panels"] if p["title"] == "Grant latency")
    assert heat["type"] == "heatmap" and heat["targets"][0]["format"] == "heatmap"


def test_the_dashboard_has_namespace_and_pod_variables_and_a_panel_per_pod() -> None:
    """Variables namespace and pod read the pod labels of the instance series (host instances, whose are empty,
    left out); one panel repeats per pod with its entitled and delivered share, memory against its limit and grant
    wait; every query filters by the node label the PodMonitor sets, none by the instance label (a container id)."""
    dash = json.loads(DASHBOARD.read_text())
    variables = {t["name"]: t for t in dash["templating"]["list"]}
    assert variables["namespace"]["query"] == 'label_values(cgpu_instance_weight{node=~"$node", namespace!=""}, ' \
                                              'namespace)'
    assert 'namespace=~"$namespace"' in variables["pod"]["query"] and 'pod!=""' in variables["pod"]["query"]
    (per_pod,) = [p for p in dash["panels"] if p.get("repeat") == "pod"]
    exprs = [t["expr"] for t in per_pod["targets"]]
    for metric in ("cgpu_instance_entitled_seconds_total", "cgpu_instance_delivered_seconds_total",
                   "cgpu_instance_memory_used_bytes", "cgpu_instance_memory_limit_bytes",
                   "cgpu_instance_grant_wait_p50_seconds", "cgpu_instance_grant_wait_p99_seconds"):
        assert any(metric in e for e in exprs), metric
    assert all('pod=~"$pod"' in e and 'namespace=~"$namespace"' in e for e in exprs)
    every = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert all('node=~"$node"' in e for e in every) and not any("instance=~" in e for e in every)

"""``metrics_listen``: GET /metrics alone, with no token, on a TCP port a Prometheus in the cluster can reach (the
PodMonitor of deploy/kubernetes scrapes it); nothing else of the admin API is there."""

from __future__ import annotations

import http.client
import socket
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from arbiterd.server import config


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ask(port: int, method: str, path: str, body: str | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def test_metrics_are_served_without_a_token_and_nothing_else_is(daemon_factory: Any) -> None:
    port = free_port()
    d = daemon_factory.start("--sim-gpus", "1x16GiB", "--identity", "declared", "--metrics-listen",
                             f"127.0.0.1:{port}")
    d.ctl("echo", "create job-a uid=0 weight=2", "inst_ctl")
    status, text = ask(port, "GET", "/metrics")
    assert status == 200
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"cgpu_gpu_busy_seconds", "cgpu_instance_weight", "cgpu_clients"} <= names
    weights = [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "cgpu_instance_weight"]
    assert [(s.labels["instance"], s.value) for s in weights] == [("job-a", 2.0)]
    before = d.ctl("cat", "0/policy").stdout
    assert ask(port, "GET", "/v1/status")[0] == 404
    assert ask(port, "GET", "/v1/tree/inst_ctl")[0] == 404
    assert ask(port, "PUT", "/v1/tree/alloc_ctl", "create x token=0 gpu=0 memsize=1GiB")[0] in (404, 405)
    assert ask(port, "PUT", "/v1/tree/0/policy", "5")[0] in (404, 405)
    assert d.ctl("cat", "0/policy").stdout == before  # nothing changed


@pytest.mark.parametrize("bad", ["9447", ":9447", "0.0.0.0:99999", "host name:80", "0.0.0.0:http"])
def test_a_bad_address_is_refused_with_one_line(bad: str) -> None:
    _, errors = config.from_mapping({"metrics_listen": bad})
    assert errors == [f"metrics_listen: expected a HOST:PORT, got {bad!r}"]

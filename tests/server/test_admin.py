"""The admin API in process (aiohttp's test client): tree reads and writes, refusals by error type."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from arbiterd.server.admin import make_admin_app
from arbiterd.server.hub import Hub


@pytest.fixture
async def client(hub: Hub) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    # the test server listens on loopback TCP, where every request needs the bearer token
    async with TestClient(TestServer(make_admin_app(hub, token="secret")),
                          headers={"Authorization": "Bearer secret"}) as c:
        yield c


async def test_tree_reads_and_a_write_that_takes_effect_and_is_saved(client: TestClient, hub: Hub) -> None:  # type: ignore[type-arg]
    r = await client.get("/v1/tree/0")
    assert r.status == 200 and (await r.text()).split()[:3] == ["policy", "max_inst", "prio_ratio"]
    r = await client.put("/v1/tree/0/policy", data="4")
    assert r.status == 200
    assert (await (await client.get("/v1/tree/0/policy")).text()) == "4\n"
    assert json.loads(hub.store.path.read_text())["gpus"]["0"]["policy"] == 4


@pytest.mark.parametrize(("path", "value", "status", "reason"), [
    ("0/policy", "9", 400, "policy: 9 is out of range 0..5"),
    ("0/free_weight", "3", 403, "read-only"),
    ("0/nope", "1", 404, "no such path"),
    ("0/max_inst", "0", 400, "out of range"),
])
async def test_refusals_answer_the_status_of_their_error_type(client: TestClient, path: str, value: str,  # type: ignore[type-arg]
                                                              status: int, reason: str) -> None:
    r = await client.put(f"/v1/tree/{path}", data=value)
    text = await r.text()
    assert r.status == status and reason in text and text.count("\n") == 1


async def test_a_conflict_is_409_and_changes_nothing(client: TestClient, hub: Hub) -> None:  # type: ignore[type-arg]
    assert (await client.put("/v1/tree/inst_ctl", data="create a weight=10")).status == 200
    r = await client.put("/v1/tree/0/max_inst", data="5")
    assert r.status == 409 and "below the sum of weights" in await r.text()
    assert hub.arbiter.scheds[0].settings.max_inst == 16


async def test_a_state_that_cannot_be_saved_is_507_and_changes_nothing(client: TestClient, hub: Hub,  # type: ignore[type-arg]
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    r = await client.put("/v1/tree/0/policy", data="3")
    assert r.status == 507 and "nothing was changed" in await r.text()
    assert hub.arbiter.scheds[0].settings.policy == 1


async def test_status_and_metrics(client: TestClient) -> None:  # type: ignore[type-arg]
    doc = await (await client.get("/v1/status")).json()
    assert doc["schema"] == 1 and [g["index"] for g in doc["gpus"]] == [0, 1]
    g = doc["gpus"][0]
    assert g["policy"] == 1 and g["slice_ms"] == "auto" and g["slice_effective_ms"] == 5.0
    text = await (await client.get("/metrics")).text()
    assert 'cgpu_gpu_policy{gpu="0"} 1.0' in text


async def test_tcp_requests_without_the_token_are_refused(client: TestClient) -> None:  # type: ignore[type-arg]
    r = await client.get("/v1/status", headers={"Authorization": "Bearer wrong"})
    assert r.status == 401 and "bearer token" in await r.text()

"""The plugin's allocation records and token directories on disk."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from cgpu_device_plugin.devices import Resource
from cgpu_device_plugin.store import ALLOC_ID, AllocationStore, Record, new_alloc_id, token_digest


def record(alloc_id: str, *devices: str) -> Record:
    return Record(alloc_id, Resource.MEM, devices, (0,), (len(devices) << 30,), 0, 1.0)


def test_allocation_ids_look_like_mem_or_core_and_12_hex() -> None:
    for resource in Resource:
        alloc_id = new_alloc_id(resource)
        assert ALLOC_ID.match(alloc_id) and alloc_id.startswith(resource.value + "-")
    assert new_alloc_id(Resource.MEM) != new_alloc_id(Resource.MEM)


def test_token_dir_is_0755_file_0444_and_arbiterd_gets_its_sha256(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path)
    store.load()
    digest = store.create_token("mem-0123456789ab")
    d = tmp_path / "mem-0123456789ab"
    token = (d / "token").read_text()
    assert stat.S_IMODE(d.stat().st_mode) == 0o755 and stat.S_IMODE((d / "token").stat().st_mode) == 0o444
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700  # only root on the host sees the tokens
    assert len(token.strip()) == 64 and int(token, 16) >= 0  # 32 random bytes, hex
    assert digest == hashlib.sha256(token.strip().encode()).hexdigest() == token_digest(token + "\n\n")
    assert store.token_sha("mem-0123456789ab") == digest


def test_records_persist_atomically_and_index_their_devices(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path)
    store.load()
    store.add(record("mem-aaaaaaaaaaaa", "g-mem-0", "g-mem-1"))
    store.add(record("mem-bbbbbbbbbbbb", "g-mem-2"))
    assert stat.S_IMODE((tmp_path / "state.json").stat().st_mode) == 0o600
    assert not list(tmp_path.glob(".state.json.*"))  # no temp file left behind
    again = AllocationStore(tmp_path)
    again.load()
    assert again.records == store.records
    assert [r.alloc_id for r in again.owners(["g-mem-1", "g-mem-2", "g-mem-9"])] == ["mem-aaaaaaaaaaaa",
                                                                                     "mem-bbbbbbbbbbbb"]
    again.remove("mem-aaaaaaaaaaaa")
    assert again.owners(["g-mem-1"]) == []
    assert list(json.loads((tmp_path / "state.json").read_text())["allocations"]) == ["mem-bbbbbbbbbbbb"]


def test_remove_deletes_the_token_directory(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path)
    store.load()
    store.create_token("core-aaaaaaaaaaaa")
    store.add(record("core-aaaaaaaaaaaa", "g-core-0"))
    assert store.remove("core-aaaaaaaaaaaa") is not None
    assert not (tmp_path / "core-aaaaaaaaaaaa").exists()


def test_an_unreadable_state_file_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "state.json").write_text("{not json")
    store = AllocationStore(tmp_path)
    store.load()
    assert store.records == {}
    assert len(list(tmp_path.glob("state.json.bad-*"))) == 1
    assert "unreadable" in caplog.text


def test_stray_directories_are_found(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path)
    store.load()
    store.create_token("mem-aaaaaaaaaaaa")
    store.create_token("mem-bbbbbbbbbbbb")
    store.add(record("mem-aaaaaaaaaaaa", "g-mem-0"))
    (tmp_path / "not-an-allocation").mkdir()
    assert store.stray_dirs() == ["mem-bbbbbbbbbbbb"]


def test_paths_are_only_made_from_allocation_ids(tmp_path: Path) -> None:
    store = AllocationStore(tmp_path)
    with pytest.raises(ValueError, match="not an allocation id"):
        store.alloc_path("../etc")

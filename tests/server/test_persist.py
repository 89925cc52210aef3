"""The state file: written atomically, a missing file is no problem, a broken one is set aside."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from arbiterd.server.persist import StateStore


def test_save_then_load_round_trips_with_owner_only_mode(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path))
    store.save({"version": 1, "gpus": {"0": {"policy": 2}}})
    assert store.load() == ({"version": 1, "gpus": {"0": {"policy": 2}}}, None)
    assert os.stat(store.path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_missing_file_is_no_problem(tmp_path: Path) -> None:
    assert StateStore(str(tmp_path)).load() == (None, None)


def test_unreadable_json_is_moved_aside_and_said(tmp_path: Path) -> None:
    store = StateStore(str(tmp_path))
    store.path.write_text("{not json")
    doc, problem = store.load()
    assert doc is None and problem is not None and "moved to" in problem
    assert not store.path.exists()
    assert any(p.name.startswith("state.json.bad-") for p in tmp_path.iterdir())


def test_a_failed_save_leaves_the_old_file_and_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fails mid-write (here: fsync) leaves the old state whole and no temporary file."""
    store = StateStore(str(tmp_path))
    store.save({"a": 1})

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        store.save({"a": 2})
    monkeypatch.undo()
    assert json.loads(store.path.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]

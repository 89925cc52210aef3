"""Reload re-reads the config file: per-GPU settings apply to every GPU, restart-only options wait,
and the flags the daemon started with still win. (Async: the hub arms the core's timer on its loop.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from arbiterd.server import config, reload
from arbiterd.server.hub import Hub


def reload_with(hub: Hub, tmp_path: Path, text: str, flags: dict[str, object]) -> bool:
    path = tmp_path / "cfg.toml"
    path.write_text(text)
    hub.config.source = str(path)
    return reload.reload(hub, flags)


async def test_gpu_settings_apply_to_every_gpu(hub: Hub, tmp_path: Path) -> None:
    assert reload_with(hub, tmp_path, "policy = 4\nslice_ms = 9\n", {})
    assert [(s.settings.policy, s.settings.slice_ms) for s in hub.arbiter.scheds.values()] == [(4, 9), (4, 9)]


async def test_flags_keep_winning_and_are_not_reported_changed(hub: Hub, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    hub.config = config.load(None, {"max_clients": 7})
    with caplog.at_level(logging.INFO):
        assert reload_with(hub, tmp_path, "max_clients = 100\nlinger_s = 3\n", {"max_clients": 7})
    assert hub.config.max_clients == 7 and hub.config.linger_s == 3
    assert not any("max_clients" in r.message for r in caplog.records)


async def test_restart_only_options_wait_and_a_bad_file_changes_nothing(hub: Hub, tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    old_run_dir = hub.config.run_dir
    with caplog.at_level(logging.WARNING):
        assert reload_with(hub, tmp_path, 'run_dir = "/elsewhere"\n', {})
    assert hub.config.run_dir == old_run_dir
    assert any("run_dir changed; it takes effect at the next restart" in r.message for r in caplog.records)
    assert not reload_with(hub, tmp_path, "policy = 99\n", {})
    assert hub.arbiter.scheds[0].settings.policy == 1

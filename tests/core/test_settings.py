"""One way to declare a setting: every setting of arbiterd and of the plugin is a Setting, declared once, and
every surface (flag, TOML key, tree file) is the one its declaration names."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from arbiterd.core.errors import SettingError
from arbiterd.core.setting import AUTO, Setting
from arbiterd.core.settings import GLOBAL, GPU, INSTANCE
from arbiterd.core.tree import GLOBAL_FILES, GPU_FILES, GPU_READONLY, INST_FILES, INSTANCE_READONLY
from arbiterd.main import build_parser as arbiterd_parser
from arbiterd.server import config
from cgpu_device_plugin import config as plugin_config
from cgpu_device_plugin.main import build_parser as plugin_parser

EVERY = {"gpu": GPU, "instance": INSTANCE, "global": GLOBAL, "daemon": config.OPTIONS,
         "plugin": plugin_config.SETTINGS}
ALL = [s for table in EVERY.values() for s in table.values()]
NOT_SETTINGS = {"help", "config", "check_config", "version"}


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest not in NOT_SETTINGS}


@pytest.mark.parametrize("s", ALL, ids=lambda s: f"{s.scope}.{s.name}")
def test_every_setting_is_complete_and_its_default_passes_its_own_check(s: Setting[Any]) -> None:
    assert s.name and s.help and s.expected and "\n" not in s.help
    assert s.flag or s.toml or s.tree or s.name == "core_percent", "a setting that appears nowhere"
    if s.kind != "percent":  # core_percent's 0 means "none given"; it is never stored as such
        assert s.valid(s.default) == s.default


def test_each_setting_is_declared_once() -> None:
    """A name may stand in two tables only as the same declaration (default_memsize: the tree's and the
    daemon's file and flag); the plugin's are its own program's."""
    arbiterd = [GPU, INSTANCE, GLOBAL, config.OPTIONS]
    seen: dict[str, Setting[Any]] = {}
    for table in arbiterd:
        for name, s in table.items():
            assert seen.setdefault(name, s) is s, name
    assert config.OPTIONS["default_memsize"] is GLOBAL["default_memsize"]


def test_arbiterd_flags_are_the_settings_that_say_flag() -> None:
    flags = _flags(arbiterd_parser())
    declared = {s.name: s for s in config.SETTINGS if s.flag}
    assert set(flags) == set(declared)
    for name, action in flags.items():
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert action.default is None  # the file's value, or the declaration's default, stands
        assert declared[name].help.replace("%", "%%") in (action.help or "")


def test_plugin_flags_are_the_settings_that_say_flag() -> None:
    flags = _flags(plugin_parser())
    declared = {s.name: s for s in plugin_config.SETTINGS.values() if s.flag}
    assert set(flags) == set(declared)
    for name, action in flags.items():
        assert action.option_strings[0] == "--" + name.replace("_", "-")
        assert list(action.choices or ()) == list(declared[name].choices)


@pytest.mark.parametrize(("from_mapping", "settings"), [
    (config.from_mapping, config.SETTINGS), (plugin_config.from_mapping, plugin_config.SETTINGS.values()),
], ids=["arbiterd", "plugin"])
def test_toml_keys_are_the_settings_that_say_toml(from_mapping: Any, settings: Any) -> None:
    keys = [s for s in settings if s.toml]
    for s in keys:
        _, errs = from_mapping({s.name: s.external(s.default)})
        assert errs == [], (s.name, errs)
    for name in ("nonsense", "gpu", "source", "upgrade", "weight", "kubelet_socket"):
        _, errs = from_mapping({name: 1})
        assert errs == [f"{name}: unknown setting"]


def test_tree_files_are_the_settings_that_say_tree() -> None:
    assert [n for n in GPU_FILES if n not in GPU_READONLY] == [n for n in GPU if GPU[n].tree] == list(GPU)
    assert {n for n in INST_FILES if n not in INSTANCE_READONLY} == {n for n, s in INSTANCE.items() if s.tree}
    assert {n for n, s in GLOBAL.items() if s.tree} <= set(GLOBAL_FILES)
    assert not any(s.tree for s in [*config.OPTIONS.values(), *plugin_config.SETTINGS.values()]
                   if s.scope in ("daemon", "plugin"))


@pytest.mark.parametrize(("s", "value", "message"), [
    (GPU["policy"], 9, "policy: 9 is out of range 0..5"),
    (GPU["policy"], "x", "policy: expected an integer 0..5, got 'x'"),
    (GPU["slice_ms"], "soon", "slice_ms: expected auto or an integer 1..100, got 'soon'"),
    (INSTANCE["memsize"], -1, "memsize: expected a size in bytes (or with KiB/MiB/GiB), got -1"),
    (INSTANCE["core_percent"], 7, "core_percent: expected a multiple of 5 from 5 to 100, got 7"),
    (GLOBAL["upgrade"], 2, "upgrade: 2 is out of range 0..1"),
    (config.OPTIONS["realtime_priority"], 100, "realtime_priority: expected an integer 0..99, got 100"),
    (config.OPTIONS["max_clients"], "10", "max_clients: expected an integer 1..100000, got '10'"),
    (config.OPTIONS["idle_timeout_s"], 0, "idle_timeout_s: expected seconds in (0, 3600], got 0"),
    (config.OPTIONS["identity"], "trusted", "identity: expected one of cgroup, declared, got 'trusted'"),
    (config.OPTIONS["trust_client_env"], "yes", "trust_client_env: expected true or false, got 'yes'"),
    (config.OPTIONS["client_mode"], "999", "client_mode: expected a file mode 0..0o777"),
    (config.OPTIONS["socket_group"], "a:b", "socket_group: expected a group name, got 'a:b'"),
    (config.OPTIONS["admin_listen"], "0.0.0.0:80", "admin_listen: expected a loopback HOST:PORT, got '0.0.0.0:80'"),
    (config.OPTIONS["sim_gpus"], "lots", "sim_gpus: expected COUNTxSIZE like 2x16GiB, got 'lots'"),
    (config.OPTIONS["alloc_mount"], "/", "alloc_mount: expected an absolute path inside the container, got '/'"),
    (config.OPTIONS["run_dir"], "", "run_dir: expected a path, got ''"),
    (plugin_config.SETTINGS["alloc_dir"], "rel", "alloc_dir: expected an absolute path, got 'rel'"),
    (plugin_config.SETTINGS["alloc_mount"], "/", "alloc_mount: expected a directory below /, got '/'"),
    (plugin_config.SETTINGS["pair_window_s"], True, "pair_window_s: expected seconds 0..600, got True"),
    (plugin_config.SETTINGS["placement"], "random", "placement: expected one of binpack, spread, got 'random'"),
])
def test_a_bad_value_raises_one_setting_error_of_one_line(s: Setting[Any], value: object, message: str) -> None:
    with pytest.raises(SettingError) as exc:
        s.check(value)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


@pytest.mark.parametrize(("s", "value", "stored"), [
    (GPU["slice_ms"], "auto", AUTO), (GPU["slice_ms"], " 12 ", 12), (GLOBAL["default_memsize"], "4GiB", 4 << 30),
    (INSTANCE["highprio"], True, 1), (config.OPTIONS["client_mode"], "0660", 0o660),
    (config.OPTIONS["client_mode"], None, None), (config.OPTIONS["idle_timeout_s"], 2, 2),
    (plugin_config.SETTINGS["poll_interval_s"], 0.5, 0.5),
])
def test_a_good_value_is_stored_in_its_kind(s: Setting[Any], value: object, stored: object) -> None:
    assert s.check(value) == stored


def test_a_narrower_range_is_named_in_the_message() -> None:
    with pytest.raises(SettingError, match=r"weight: 9 is out of range 1\.\.4"):
        INSTANCE["weight"].check(9, 4)

"""The daemon's config: one declaration per option, flags and file alike, the same errors as the tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiterd.core import tree
from arbiterd.core.arbiter import Arbiter, GpuInfo
from arbiterd.core.errors import SettingError
from arbiterd.core.settings import AUTO
from arbiterd.main import build_parser, overrides
from arbiterd.server import config


def test_defaults_come_from_the_settings_table() -> None:
    cfg = config.Config()
    assert (cfg.gpu.policy, cfg.gpu.max_inst, cfg.gpu.prio_ratio, cfg.gpu.slice_ms) == (1, 16, 50, AUTO)
    assert (cfg.gpu.slice_min_ms, cfg.gpu.slice_max_ms, cfg.gpu.handover_target_pct) == (5, 100, 2)


def test_a_file_sets_options_and_per_gpu_settings(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('policy = 2\nmax_inst = 10\nlinger_s = 5\nidentity = "declared"\n')
    cfg = config.load(str(path), {})
    assert (cfg.gpu.policy, cfg.gpu.max_inst, cfg.linger_s, cfg.identity) == (2, 10, 5, "declared")
    assert cfg.source == str(path)


def test_slice_ms_is_auto_or_a_number(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text('slice_ms = "auto"\n')
    assert config.load(str(path), {}).gpu.slice_ms == AUTO
    assert config.load(None, {"slice_ms": "12"}).gpu.slice_ms == 12
    _, errs = config.from_mapping({"slice_min_ms": 50, "slice_max_ms": 20})
    assert errs == ["slice_min_ms: 50 is above slice_max_ms 20"]


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text("policy = 2\nmax_clients = 10\n")
    flags = overrides(build_parser().parse_args(["--policy", "4", "--max-clients", "20", "--slice-ms", "7"]))
    cfg = config.load(str(path), flags)
    assert (cfg.gpu.policy, cfg.max_clients, cfg.gpu.slice_ms) == (4, 20, 7)


@pytest.mark.parametrize(("key", "value", "tree_path"), [
    ("policy", 9, "0/policy"), ("max_inst", 0, "0/max_inst"), ("prio_ratio", 100, "0/prio_ratio"),
    ("slice_ms", "abc", "0/slice_ms"), ("slice_ms", 0, "0/slice_ms"),
    ("handover_target_pct", 90, "0/handover_target_pct"),
])
def test_a_bad_setting_gets_the_same_message_as_in_the_tree(key: str, value: object, tree_path: str) -> None:
    _, errs = config.from_mapping({key: value})
    arb = Arbiter([GpuInfo(0, "sim", "GPU-x", 2**30, True)])
    with pytest.raises(SettingError) as exc:
        tree.write(arb, tree_path, str(value), 0)
    assert errs == [str(exc.value)]


@pytest.mark.parametrize(("data", "fragment"), [
    ({"nonsense": 1}, "nonsense: unknown setting"), ({"identity": "trusted"}, "identity: expected one of"),
    ({"linger_s": -1}, "linger_s: expected an integer 0..86400"), ({"admin_listen": "0.0.0.0:80"}, "loopback"),
    ({"sim_gpus": "lots"}, "sim_gpus: expected COUNTxSIZE"), ({"default_memsize": "big"}, "default_memsize"),
    ({"handshake_timeout_s": 0}, "expected seconds"), ({"trust_client_env": "yes"}, "true or false"),
])
def test_every_error_is_one_line_naming_the_setting(data: dict[str, object], fragment: str) -> None:
    _, errs = config.from_mapping(data)
    assert len(errs) == 1 and fragment in errs[0] and "\n" not in errs[0], errs


def test_check_file_lists_every_error_and_accepts_the_shipped_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("policy = 7\nmax_clients = 0\n")
    assert len(config.check_file(str(bad))) == 2
    shipped = Path(__file__).resolve().parents[2] / "systemd" / "arbiterd.toml"
    assert config.check_file(str(shipped)) == []
    broken = tmp_path / "broken.toml"
    broken.write_text("policy = \n")
    assert "not valid TOML" in config.check_file(str(broken))[0]


def test_default_memsize_is_the_tree_setting_declared_once(tmp_path: Path) -> None:
    from arbiterd.core.settings import GLOBAL

    assert config.OPTIONS["default_memsize"] is GLOBAL["default_memsize"]
    cfg = config.load(None, overrides(build_parser().parse_args(["--default-memsize", "4GiB"])))
    assert cfg.default_memsize == config.default_memsize(cfg) == 4 << 30
    path = tmp_path / "a.toml"
    path.write_text("default_memsize = 1073741824\n")
    assert config.load(str(path), {}).default_memsize == 1 << 30
    _, errs = config.from_mapping({"default_memsize": "big"})
    arb = Arbiter([GpuInfo(0, "sim", "GPU-x", 2**30, True)])
    with pytest.raises(SettingError) as exc:
        tree.write(arb, "default_memsize", "big", 0)
    assert errs == [str(exc.value)]


@pytest.mark.parametrize(("argv", "line"), [
    (["--max-clients", "0"], "arbiterd: max_clients: expected an integer 1..100000, got 0"),
    (["--policy", "9"], "arbiterd: policy: 9 is out of range 0..5"),
    (["--client-mode", "999"], "arbiterd: client_mode: expected a file mode 0..0o777 (in TOML 0o660, on the "
                               "command line 0660), got '999'"),
    (["--admin-listen", "0.0.0.0:80"], "arbiterd: admin_listen: expected a loopback HOST:PORT, got '0.0.0.0:80'"),
])
def test_a_bad_flag_is_one_line_and_nothing_starts(argv: list[str], line: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from arbiterd.main import main

    assert main(argv) == 2
    assert capsys.readouterr().err.splitlines() == [line]


def test_check_config_prints_each_error_or_ok(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from arbiterd.main import main

    bad = tmp_path / "bad.toml"
    bad.write_text('policy = 7\nidentity = "x"\n')
    assert main(["--check-config", str(bad)]) == 1
    assert capsys.readouterr().out.splitlines() == ["policy: 7 is out of range 0..5",
                                                    "identity: expected one of cgroup, declared, got 'x'"]
    good = tmp_path / "good.toml"
    good.write_text('slice_ms = "auto"\ndefault_memsize = "2GiB"\n')
    assert main(["--check-config", str(good)]) == 0
    assert capsys.readouterr().out == f"{good}: ok\n"

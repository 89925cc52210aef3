"""Configuration: TOML file, flags over the file, and one line per bad value."""

from __future__ import annotations

from pathlib import Path

import pytest

from arbiterd.core.errors import SettingError
from cgpu_device_plugin import config as config_mod
from cgpu_device_plugin.main import main


def test_defaults_are_the_documented_paths() -> None:
    cfg = config_mod.load(None, {})
    assert (cfg.kubelet_dir, cfg.admin_socket, cfg.socket_dir, cfg.libcgpu, cfg.alloc_dir, cfg.alloc_mount) == (
        "/var/lib/kubelet/device-plugins", "/run/cgpu/admin.sock", "/run/cgpu", "/usr/local/lib/cgpu/libcgpu.so",
        "/var/lib/cgpu/alloc", "/run/cgpu-alloc")
    assert cfg.placement == "binpack" and cfg.log_level == "info"
    assert str(cfg.kubelet_socket) == "/var/lib/kubelet/device-plugins/kubelet.sock"


def test_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "plugin.toml"
    path.write_text('placement = "spread"\nalloc_dir = "/srv/alloc"\npoll_interval_s = 1\n')
    cfg = config_mod.load(str(path), {"placement": "binpack"})
    assert cfg.placement == "binpack" and cfg.alloc_dir == "/srv/alloc" and cfg.poll_interval_s == 1
    assert cfg.source == str(path)


@pytest.mark.parametrize(("toml", "error"), [
    ('placement = "random"', "placement: expected one of binpack, spread, got 'random'"),
    ('log_level = "loud"', "log_level: expected one of debug, info, warning, error, got 'loud'"),
    ('alloc_dir = "relative/dir"', "alloc_dir: expected an absolute path, got 'relative/dir'"),
    ('alloc_mount = "/"', "alloc_mount: expected a directory below /, got '/'"),
    ("poll_interval_s = 0", "poll_interval_s: expected seconds 0.01..3600, got 0"),
    ("pair_window_s = true", "pair_window_s: expected seconds 0..600, got True"),
    ('kubelet_socket = "/x"', "kubelet_socket: unknown setting"),
    ("placement = ", "not valid TOML"),
])
def test_a_bad_value_is_one_line_naming_it(tmp_path: Path, toml: str, error: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plugin.toml"
    path.write_text(toml + "\n")
    errors = config_mod.check_file(str(path))
    assert len(errors) == 1 and error in errors[0]
    assert main(["--check-config", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and error in out[0]


def test_every_error_is_reported_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plugin.toml"
    path.write_text('placement = "x"\nlog_level = "y"\n')
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["cgpu-device-plugin: placement: expected one of binpack, spread, got 'x'",
                   "cgpu-device-plugin: log_level: expected one of debug, info, warning, error, got 'y'"]


def test_check_config_accepts_a_good_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plugin.toml"
    path.write_text('placement = "spread"\n')
    assert main(["--check-config", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    errors = config_mod.check_file(str(tmp_path / "nope.toml"))
    assert len(errors) == 1 and "cannot read" in errors[0]


def test_a_bad_flag_value_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--placement", "random"])
    assert exc.value.code == 2
    assert "invalid choice: 'random'" in capsys.readouterr().err


def test_the_plugin_reads_its_config_with_arbiterds_loader() -> None:
    from arbiterd.cli import configfile

    assert isinstance(config_mod.LOADER, configfile.Loader)
    assert issubclass(config_mod.ConfigError, SettingError)


def test_the_plugin_uses_arbiterds_admin_client() -> None:
    from arbiterd.tools import adminclient
    from cgpu_device_plugin import admin

    assert issubclass(admin.AdminClient, adminclient.AdminClient)
    assert admin.Unreachable is adminclient.Unreachable and admin.Refused is adminclient.Refused
    assert admin.AdminClient("/x").timeout == 5.0


def test_every_flag_says_its_default() -> None:
    from cgpu_device_plugin.main import build_parser

    helps = {a.dest: a.help or "" for a in build_parser()._actions}
    for name, s in config_mod.SETTINGS.items():
        assert helps[name].endswith(f"(default {s.shown(s.default)})"), name


def test_arbiterd_imports_neither_grpc_nor_the_plugin_and_the_plugins_command_line_needs_no_grpc() -> None:
    import subprocess
    import sys

    probe = ("import sys; import {mods}; "
             "bad = sorted(m for m in sys.modules if m.split('.')[0] in {banned}); print(bad); sys.exit(bool(bad))")
    daemon = "arbiterd.main, arbiterd.server.daemon, arbiterd.server.reload, arbiterd.tools.cgpuctl, arbiterd.tools.smi"
    for mods, banned in ((daemon, ("grpc", "cgpu_device_plugin")),
                         ("cgpu_device_plugin.main, cgpu_device_plugin.config, cgpu_device_plugin.admin", ("grpc",))):
        r = subprocess.run([sys.executable, "-c", probe.format(mods=mods, banned=banned)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr

"""Plugin configuration: a TOML file, overridden by the flags that were given."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

PLACEMENTS = ("binpack", "spread")
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(Exception):
    """One or more settings are invalid; the message lists each on its own line."""


@dataclass(slots=True)
class Config:
    """Every setting of ``cgpu-device-plugin``. Field names are the TOML keys."""

    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    admin_socket: str = "/run/cgpu/admin.sock"
    socket_dir: str = "/run/cgpu"
    libcgpu: str = "/usr/local/lib/cgpu/libcgpu.so"
    alloc_dir: str = "/var/lib/cgpu/alloc"
    alloc_mount: str = "/run/cgpu-alloc"
    placement: str = "binpack"
    log_level: str = "info"
    poll_interval_s: float = 2.0
    watch_interval_s: float = 1.0
    pair_window_s: float = 5.0
    source: str | None = field(default=None, repr=False)

    @property
    def kubelet_socket(self) -> Path:
        return Path(self.kubelet_dir) / "kubelet.sock"


PATHS = ("kubelet_dir", "admin_socket", "socket_dir", "libcgpu", "alloc_dir", "alloc_mount")
SECONDS = {"poll_interval_s": (0.01, 3600.0), "watch_interval_s": (0.01, 3600.0), "pair_window_s": (0.0, 600.0)}


def _errors(cfg: Config) -> list[str]:
    errs: list[str] = []
    for name in PATHS:
        v = getattr(cfg, name)
        if not isinstance(v, str) or not v.startswith("/") or "\0" in v or "\n" in v:
            errs.append(f"{name}: expected an absolute path, got {v!r}")
    if isinstance(cfg.alloc_mount, str) and cfg.alloc_mount.rstrip("/") == "":
        errs.append("alloc_mount: expected a directory below /, got '/'")
    for name, (lo, hi) in SECONDS.items():
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            errs.append(f"{name}: expected seconds {lo:g}..{hi:g}, got {v!r}")
    if cfg.placement not in PLACEMENTS:
        errs.append(f"placement: expected one of {', '.join(PLACEMENTS)}, got {cfg.placement!r}")
    if cfg.log_level not in LOG_LEVELS:
        errs.append(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {cfg.log_level!r}")
    return errs


def from_mapping(data: dict[str, Any]) -> tuple[Config, list[str]]:
    """A config built from ``data`` over the defaults, and every error found."""
    cfg = Config()
    known = {f.name for f in fields(Config)} - {"source"}
    errs = [f"{k}: unknown setting" for k in data if k not in known]
    for key, value in data.items():
        if key in known:
            setattr(cfg, key, value)
    return cfg, errs + _errors(cfg)


def read_file(path: str) -> tuple[dict[str, Any], list[str]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return {}, [f"{path}: cannot read ({exc.strerror})"]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"{path}: not valid TOML ({exc})"]


def load(path: str | None, overrides: dict[str, Any]) -> Config:
    """Read ``path`` (if any) and apply ``overrides``; raise ConfigError listing every error."""
    data: dict[str, Any] = {}
    errs: list[str] = []
    if path is not None:
        data, errs = read_file(path)
    cfg, more = from_mapping({**data, **overrides})
    cfg.source = path
    errs += more
    if errs:
        raise ConfigError("\n".join(errs))
    return cfg


def check_file(path: str) -> list[str]:
    """Every error in the config file at ``path``, one per line (empty when valid)."""
    data, errs = read_file(path)
    if errs:
        return errs
    return from_mapping(data)[1]

"""Daemon configuration: a TOML file, overridden by the flags that were given."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from arbiterd.core.errors import SettingError
from arbiterd.core.scheduler import MAX_INST_RANGE, PRIO_RATIO_RANGE, SLICE_MS_RANGE, GpuSettings
from arbiterd.core.units import parse_size
from arbiterd.server.cpu import PRIORITY_RANGE

IDENTITY_SOURCES = ("cgroup", "declared")
LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(slots=True)
class Config:
    """Every setting of ``arbiterd``. Field names are the TOML keys."""

    run_dir: str = "/run/cgpu"
    state_dir: str = "/var/lib/cgpu"
    sim_gpus: str | None = None
    identity: str = "cgroup"
    proc_root: str = "/proc"
    trust_client_env: bool = True
    policy: int = 1
    max_inst: int = 16
    prio_ratio: int = 50
    slice_ms: int = 5
    overrun_ms: int = 500
    default_memsize: str = "0"
    linger_s: int = 60
    client_mode: int = 0o666
    client_group: str | None = None
    admin_mode: int = 0o600
    admin_group: str | None = None
    admin_listen: str | None = None
    max_clients: int = 1024
    handshake_timeout_s: float = 5.0
    frame_timeout_s: float = 5.0
    log_level: str = "info"
    realtime_priority: int = 0
    source: str | None = field(default=None, repr=False)

    def gpu_settings(self) -> GpuSettings:
        return GpuSettings(policy=self.policy, max_inst=self.max_inst, prio_ratio=self.prio_ratio,
                           slice_ms=self.slice_ms, overrun_ms=self.overrun_ms)


def _errors(cfg: Config) -> list[str]:
    errs: list[str] = []

    def rng(name: str, lo: int, hi: int) -> None:
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            errs.append(f"{name}: expected an integer {lo}..{hi}, got {v!r}")

    rng("policy", 0, 5)
    rng("max_inst", *MAX_INST_RANGE)
    rng("prio_ratio", *PRIO_RATIO_RANGE)
    rng("slice_ms", *SLICE_MS_RANGE)
    rng("overrun_ms", 1, 3_600_000)
    rng("linger_s", 0, 86_400)
    rng("max_clients", 1, 100_000)
    rng("client_mode", 0, 0o777)
    rng("admin_mode", 0, 0o777)
    rng("realtime_priority", *PRIORITY_RANGE)
    if cfg.identity not in IDENTITY_SOURCES:
        errs.append(f"identity: expected one of {', '.join(IDENTITY_SOURCES)}, got {cfg.identity!r}")
    if cfg.log_level not in LOG_LEVELS:
        errs.append(f"log_level: expected one of {', '.join(LOG_LEVELS)}, got {cfg.log_level!r}")
    if not isinstance(cfg.trust_client_env, bool):
        errs.append(f"trust_client_env: expected true or false, got {cfg.trust_client_env!r}")
    for name in ("handshake_timeout_s", "frame_timeout_s"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 3600:
            errs.append(f"{name}: expected seconds in (0, 3600], got {v!r}")
    try:
        parse_size("default_memsize", str(cfg.default_memsize))
    except SettingError as exc:
        errs.append(str(exc))
    if cfg.sim_gpus is not None:
        from arbiterd.server.devices import parse_sim_gpus

        try:
            parse_sim_gpus(cfg.sim_gpus)
        except SettingError as exc:
            errs.append(str(exc))
    if cfg.admin_listen is not None:
        host, _, port = cfg.admin_listen.rpartition(":")
        if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
            errs.append(f"admin_listen: expected a loopback HOST:PORT, got {cfg.admin_listen!r}")
    for name in ("run_dir", "state_dir", "proc_root"):
        if not isinstance(getattr(cfg, name), str) or not getattr(cfg, name):
            errs.append(f"{name}: expected a path")
    return errs


def from_mapping(data: dict[str, Any], base: Config | None = None) -> tuple[Config, list[str]]:
    """Apply ``data`` onto ``base``; return the config and every error found."""
    cfg = Config() if base is None else Config(**{f.name: getattr(base, f.name) for f in fields(Config)})
    known = {f.name for f in fields(Config)} - {"source"}
    errs = [f"{k}: unknown setting" for k in data if k not in known]
    for key, value in data.items():
        if key in known:
            setattr(cfg, key, value)
    return cfg, errs + _errors(cfg)


def load(path: str | None, overrides: dict[str, Any]) -> Config:
    """Read ``path`` (if any), apply ``overrides``; raise SettingError listing every error."""
    data: dict[str, Any] = {}
    errs: list[str] = []
    if path is not None:
        data, errs = read_file(path)
    cfg, more = from_mapping({**data, **overrides})
    cfg.source = path
    errs += more
    if errs:
        raise SettingError("; ".join(errs))
    return cfg


def read_file(path: str) -> tuple[dict[str, Any], list[str]]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        return {}, [f"{path}: cannot read ({exc.strerror})"]
    try:
        return tomllib.loads(text), []
    except tomllib.TOMLDecodeError as exc:
        return {}, [f"{path}: not valid TOML ({exc})"]


def check_file(path: str) -> list[str]:
    """Every error in the config file at ``path``, one per line (empty when valid)."""
    data, errs = read_file(path)
    if errs:
        return errs
    _, errs = from_mapping(data)
    return errs

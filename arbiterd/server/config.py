"""Daemon configuration: a TOML file, overridden by the flags that were given.

Every option is declared once, as a field of :class:`Config` whose metadata
gives its help, its check and its flag; the per-GPU defaults are the settings
table of ``arbiterd.core.settings`` (top-level TOML keys and flags named after
the settings). ``arbiterd``'s argument parser, ``--check-config``, reload and
the man page are derived from these declarations.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from arbiterd.core.arbiter import OVERCOMMIT
from arbiterd.core.errors import SettingError
from arbiterd.core.settings import GLOBAL, GPU, GpuSettings, check_gpu_settings, parse_size
from arbiterd.server.cpu import PRIORITY_RANGE

IDENTITY_SOURCES = ("cgroup", "declared")
HOST_CLIENTS = ("allow", "refuse")
DEFAULT_SOCKET_GROUP = "cgpu"  # arbiter.sock's group when socket_group is not set and this group exists
DEFAULT_CLIENT_MODE = 0o660
ALLOCATION_MODES = ("off", "optional", "required")
LOG_LEVELS = ("debug", "info", "warning", "error")
Check = Callable[[str, Any], str | None]  # (name, value) -> an error, or None


def _int(lo: int, hi: int) -> Check:
    def check(name: str, v: Any) -> str | None:
        ok = not isinstance(v, bool) and isinstance(v, int) and lo <= v <= hi
        return None if ok else f"{name}: expected an integer {lo}..{hi}, got {v!r}"
    return check


def _seconds(name: str, v: Any) -> str | None:
    ok = not isinstance(v, bool) and isinstance(v, int | float) and 0 < v <= 3600
    return None if ok else f"{name}: expected seconds in (0, 3600], got {v!r}"


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(name: str, v: Any) -> str | None:
        return None if v in choices else f"{name}: expected one of {', '.join(choices)}, got {v!r}"
    return check


def _path(name: str, v: Any) -> str | None:
    return None if isinstance(v, str) and v else f"{name}: expected a path"


def _mount(name: str, v: Any) -> str | None:
    ok = isinstance(v, str) and v.startswith("/") and v != "/" and ".." not in v.split("/")
    return None if ok else f"{name}: expected an absolute path inside the container, got {v!r}"


def _bool(name: str, v: Any) -> str | None:
    return None if isinstance(v, bool) else f"{name}: expected true or false, got {v!r}"


def _optional_str(name: str, v: Any) -> str | None:
    return None if v is None or isinstance(v, str) else f"{name}: expected a string, got {v!r}"


def _size(name: str, v: Any) -> str | None:
    try:
        GLOBAL["default_memsize"].check(str(v))
    except SettingError as exc:
        return str(exc).replace("default_memsize", name, 1)
    return None


def _mode(name: str, v: Any) -> str | None:
    ok = v is None or (not isinstance(v, bool) and isinstance(v, int) and 0 <= v <= 0o777)
    return None if ok else f"{name}: expected a file mode 0..0o777 (in TOML 0o660, on the command line 0660), got {v!r}"


def _group(name: str, v: Any) -> str | None:
    ok = v is None or (isinstance(v, str) and v != "" and "\n" not in v and ":" not in v)
    return None if ok else f"{name}: expected a group name, got {v!r}"


def _sim_gpus(name: str, v: Any) -> str | None:
    if v is None:
        return None
    from arbiterd.server.devices import parse_sim_gpus

    try:
        parse_sim_gpus(str(v))
    except SettingError as exc:
        return str(exc)
    return None


def _loopback(name: str, v: Any) -> str | None:
    if v is None:
        return None
    host, _, port = str(v).rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
        return f"{name}: expected a loopback HOST:PORT, got {v!r}"
    return None


def opt(default: Any, help: str, check: Check, *, metavar: str | None = None, flag: bool = True,
        restart: bool = False, choices: tuple[str, ...] | None = None) -> Any:
    """A config option: its default, help and check; ``flag``: also a command-line flag;
    ``restart``: a reload cannot change it."""
    return field(default=default, metadata={"help": help, "check": check, "metavar": metavar, "flag": flag,
                                            "restart": restart, "choices": choices})


@dataclass(slots=True)
class Config:
    """Every setting of ``arbiterd``. Field names are the TOML keys."""

    run_dir: str = opt("/run/cgpu", "holds arbiter.sock (clients, mode 0660, group socket_group) and admin.sock "
                       "(admin, 0600); refused if another non-root user owns it, or others may write it without "
                       "the sticky bit", _path, metavar="DIR", restart=True)
    state_dir: str = opt("/var/lib/cgpu", "state.json (settings, written atomically) and admin.token; checked "
                         "as run_dir is", _path, metavar="DIR", restart=True)
    sim_gpus: str | None = opt(None, "simulate GPUs instead of NVML: 2x16GiB, or 16GiB,8GiB", _sim_gpus,
                               metavar="SPEC", restart=True)
    identity: str = opt("cgroup", "cgroup: a container's id comes from its cgroup (one root made), a host process is "
                        "uid-<uid> or an instance provisioned for its uid; declared: trust CGPU_INSTANCE and "
                        "let clients shape GPUs (development hosts only)", _one_of(IDENTITY_SOURCES),
                        choices=IDENTITY_SOURCES)
    host_clients: str = opt("allow", "allow: processes outside containers are clients too (as uid-<uid>, or an "
                            "instance provisioned for their uid); refuse: only containers "
                            "may connect",
                            _one_of(HOST_CLIENTS), choices=HOST_CLIENTS)
    proc_root: str = opt("/proc", "where peer cgroups are read (tests inject a fake one)", _path, metavar="DIR")
    allocations: str = opt("off", "off: no allocations; optional: a container presenting an allocation token "
                           "gets that allocation; required: a container process without a valid token is "
                           "refused (Kubernetes nodes with cgpu-device-plugin)", _one_of(ALLOCATION_MODES),
                           choices=ALLOCATION_MODES)
    alloc_mount: str = opt("/run/cgpu-alloc", "where a container holds its allocation tokens "
                           "(<dir>/<allocation-id>/token), read through /proc/<pid>/root", _mount,
                           metavar="DIR")
    trust_client_env: bool = opt(True, "use a container's environment for its own instance when nobody "
                                 "provisioned it (never for a host process, never beyond its own record)", _bool)
    overcommit: str = opt("refuse", "a registration on a GPU whose free_weight is 0: refuse it with an error, or "
                          "queue it at weight 0 (no GPU time) until the weight it asked for is free",
                          _one_of(OVERCOMMIT), choices=OVERCOMMIT)
    default_memsize: str = opt("0", GLOBAL["default_memsize"].help, _size, metavar="SIZE")
    linger_s: int = opt(60, "keep an instance record this long after its last client left (s)", _int(0, 86_400),
                        metavar="S")
    client_mode: int | None = opt(None, "file mode of arbiter.sock, in octal (default 0660: root and "
                                  "socket_group); where no group is set or found, a wider mode must be asked for "
                                  "here", _mode, metavar="MODE", restart=True)
    socket_group: str | None = opt(None, "group owning arbiter.sock (default: cgpu, when that group exists)",
                                   _group, metavar="GROUP", restart=True)
    client_group: str | None = opt(None, "the older name of socket_group", _group, metavar="GROUP", restart=True)
    admin_mode: int = opt(0o600, "file mode of admin.sock", _int(0, 0o777), flag=False, restart=True)
    admin_group: str | None = opt(None, "group owning admin.sock", _optional_str, metavar="GROUP", restart=True)
    admin_listen: str | None = opt(None, "also serve the admin API on loopback 127.0.0.1:PORT; requests need "
                                   "'Authorization: Bearer <state-dir/admin.token>'", _loopback,
                                   metavar="127.0.0.1:PORT", restart=True)
    max_clients: int = opt(1024, "connections beyond this are refused with an error", _int(1, 100_000),
                           metavar="N")
    max_clients_per_uid: int = opt(128, "connections one uid's host processes may hold (root is exempt); beyond "
                                   "it a new one is refused", _int(1, 100_000), metavar="N")
    max_clients_per_instance: int = opt(256, "connections one instance (a container, or a host instance) may hold; "
                                        "beyond it a new one is refused", _int(1, 100_000), metavar="N")
    max_records_per_uid: int = opt(64, "instance records one uid's host processes may make by registering "
                                   "(root is exempt; provisioned records do not count)", _int(1, 100_000),
                                   metavar="N")
    idle_timeout_s: float = opt(30.0, "close a connection that said hello but has not registered this long (s)",
                                _seconds, flag=False)
    max_unread_bytes: int = opt(1 << 20, "close a connection whose replies it has not read pass this many bytes "
                                "(its buffer is freed)", _int(64 << 10, 1 << 30), metavar="BYTES")
    handshake_timeout_s: float = opt(5.0, "drop a client that sends no hello this long (s)", _seconds, flag=False)
    frame_timeout_s: float = opt(5.0, "drop a client that leaves a frame half-sent this long (s)", _seconds,
                                 flag=False)
    log_level: str = opt("info", "debug, info, warning or error", _one_of(LOG_LEVELS), choices=LOG_LEVELS)
    realtime_priority: int = opt(0, "run under SCHED_FIFO priority N, 1..99, so a grant goes out as soon as its "
                                 "request arrives (0: normal scheduling)", _int(*PRIORITY_RANGE), metavar="N",
                                 restart=True)
    gpu: GpuSettings = field(default_factory=GpuSettings, metadata={"flag": False})
    source: str | None = field(default=None, repr=False, metadata={"flag": False})

    def gpu_settings(self) -> GpuSettings:
        """A fresh copy of the per-GPU defaults."""
        return GpuSettings(**{name: getattr(self.gpu, name) for name in GPU})


OPTIONS = {f.name: f for f in fields(Config) if "check" in f.metadata}


def from_mapping(data: dict[str, Any]) -> tuple[Config, list[str]]:
    """A config from ``data`` (TOML keys: options and per-GPU settings); every error found."""
    cfg = Config()
    errs: list[str] = []
    for key, value in data.items():
        if key in GPU:
            try:
                setattr(cfg.gpu, key, GPU[key].check(value))
            except SettingError as exc:
                errs.append(str(exc))
        elif key in OPTIONS:
            if key == "client_mode" and isinstance(value, str):  # a flag: octal text
                value = int(value, 8) if value.isascii() and value.isdigit() and set(value) <= set("01234567") \
                    else value
            setattr(cfg, key, value)
        else:
            errs.append(f"{key}: unknown setting")
    for name, f in OPTIONS.items():
        problem = f.metadata["check"](name, getattr(cfg, name))
        if problem:
            errs.append(problem)
    if cfg.client_group is not None:
        if cfg.socket_group not in (None, cfg.client_group):
            errs.append("client_group: the older name of socket_group; give one of them")
        cfg.socket_group = cfg.client_group
    if cfg.allocations != "off" and cfg.identity != "cgroup":
        errs.append("allocations: binding an allocation to its container needs identity = \"cgroup\"")
    if not errs:
        try:
            check_gpu_settings(cfg.gpu)
        except SettingError as exc:
            errs.append(str(exc))
    return cfg, errs


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
    return from_mapping(data)[1]


def default_memsize(cfg: Config) -> int:
    return parse_size("default_memsize", str(cfg.default_memsize))

"""Daemon configuration: a TOML file, overridden by the flags that were given.

Every option of the daemon is declared once, as a field of :class:`Config`
that is a :class:`~arbiterd.core.setting.Setting` (its kind, default, range or
choices, help, flag and restart); the per-GPU defaults are the settings of
``arbiterd.core.settings.GpuSettings`` (top-level TOML keys and flags named
after the settings) and ``default_memsize`` is the node-wide setting of the
tree. ``arbiterd``'s argument parser, ``--check-config``, reload, the man page
and the documents' tables are derived from these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arbiterd.cli import configfile
from arbiterd.cli.entry import LOG_LEVELS
from arbiterd.core.arbiter import OVERCOMMIT
from arbiterd.core.errors import SettingError
from arbiterd.core.setting import Setting, setting, table
from arbiterd.core.settings import GLOBAL, GPU, MAX_INST_MAX, GpuSettings, check_gpu_settings
from arbiterd.server.realtime import PRIORITY_RANGE

IDENTITY_SOURCES = ("cgroup", "declared")
HOST_CLIENTS = ("allow", "refuse")
DEFAULT_SOCKET_GROUP = "cgpu"  # arbiter.sock's group when socket_group is not set and this group exists
DEFAULT_CLIENT_MODE = 0o660
ALLOCATION_MODES = ("off", "optional", "required")
LIMIT = 100_000  # the most connections or records any of the max_* options allows


def _mount(v: str) -> str | None:
    ok = v.startswith("/") and v != "/" and ".." not in v.split("/")
    return None if ok else "an absolute path inside the container"


def _group(v: str) -> str | None:
    return None if v != "" and "\n" not in v and ":" not in v else "a group name"


def _sim_gpus(v: str) -> str | None:
    from arbiterd.server.devices import parse_sim_gpus

    parse_sim_gpus(v)  # raises a SettingError saying what is wrong
    return None


def _loopback(v: str) -> str | None:
    host, _, port = v.rpartition(":")
    return None if host in ("127.0.0.1", "localhost", "::1", "[::1]") and port.isdigit() else "a loopback HOST:PORT"


def _host_port(v: str) -> str | None:
    host, _, port = v.rpartition(":")
    ok = bool(host) and port.isdigit() and 0 < int(port) < 65536 and all(ch.isalnum() or ch in ".:-[]" for ch in host)
    return None if ok else "a HOST:PORT"


def _allow_list(v: str) -> str | None:
    ok = all(p.strip().startswith("/") and "\n" not in p for p in v.split(","))
    return None if ok else "absolute paths, separated by commas"


def _seconds(default: float, help: str) -> Any:
    return setting(default, help, 0, 3600, "seconds", lo_open=True, flag=False)


@dataclass(slots=True)
class Config:
    """Every option of ``arbiterd``. Field names are the TOML keys."""

    run_dir: str = setting("/run/cgpu", "holds arbiter.sock (clients, mode 0660, group socket_group) and admin.sock "
                           "(admin, 0600); refused if another non-root user owns it, or others may write it without "
                           "the sticky bit", kind="path", metavar="DIR", restart=True)
    state_dir: str = setting("/var/lib/cgpu", "state.json (settings, written atomically) and admin.token; checked "
                             "as run_dir is", kind="path", metavar="DIR", restart=True)
    sim_gpus: str | None = setting(None, "simulate GPUs instead of NVML: 2x16GiB, or 16GiB,8GiB", kind="string",
                                   expects="COUNTxSIZE like 2x16GiB", rule=_sim_gpus, metavar="SPEC", restart=True)
    identity: str = setting("cgroup", "cgroup: a container's id comes from its cgroup (one root made), a host process "
                            "is uid-<uid> or an instance provisioned for its uid; declared: trust CGPU_INSTANCE and "
                            "let clients shape GPUs (development hosts only)", kind="choice",
                            choices=IDENTITY_SOURCES)
    host_clients: str = setting("allow", "allow: processes outside containers are clients too (as uid-<uid>, or an "
                                "instance provisioned for their uid); refuse: only containers may connect",
                                kind="choice", choices=HOST_CLIENTS)
    proc_root: str = setting("/proc", "where peer cgroups are read (tests inject a fake one)", kind="path",
                             metavar="DIR")
    allocations: str = setting("off", "off: no allocations; optional: a container presenting an allocation token "
                               "gets that allocation; required: a container process without a valid token is "
                               "refused (Kubernetes nodes with cgpu-device-plugin)", kind="choice",
                               choices=ALLOCATION_MODES)
    alloc_mount: str = setting("/run/cgpu-alloc", "where a container holds its allocation tokens "
                               "(<dir>/<allocation-id>/token), read through /proc/<pid>/root", kind="path",
                               expects="an absolute path inside the container", rule=_mount, metavar="DIR")
    trust_client_env: bool = setting(True, "use a container's environment for its own instance when nobody "
                                     "provisioned it (never for a host process, never beyond its own record), within "
                                     "client_env_max_weight and client_env_highprio", kind="bool")
    client_env_max_weight: int = setting(1, "the most weight a container's environment may ask for its own instance "
                                         "(a core percentage counts as weight P/5); more is cut to this, with a "
                                         "warning. 25 (a GPU's most slots) gives cGPU's behaviour; identity = declared "
                                         "trusts the environment whole", 1, MAX_INST_MAX,
                                         "integer", metavar="W")
    client_env_highprio: bool = setting(False, "let a container's environment ask for high priority for its own "
                                        "instance (cGPU does); off: only an operator or an allocation grants it",
                                        kind="bool")
    overcommit: str = setting("refuse", "a registration on a GPU whose free_weight is 0: refuse it with an error, or "
                              "queue it at weight 0 (no GPU time) until the weight it asked for is free",
                              kind="choice", choices=OVERCOMMIT)
    default_memsize: int = GLOBAL["default_memsize"].as_field()
    gang_window_ms: int = setting(200, "an instance busy on two or more GPUs (policies 1 and 4) within this window is "
                                  "a gang: its turns on all of them start and end together (behaviour §11, jobs that "
                                  "span GPUs); 0: gangs off, every GPU schedules it on its own", 0, 60_000,
                                  "integer", metavar="MS")
    linger_s: int = setting(60, "keep an instance record this long after its last client left (s)", 0, 86_400,
                            "integer", metavar="S")
    client_mode: int | None = setting(None, "file mode of arbiter.sock, in octal (default 0660: root and "
                                      "socket_group); where no group is set or found, a wider mode must be asked "
                                      "for here", kind="mode", metavar="MODE", restart=True)
    socket_group: str | None = setting(None, "group owning arbiter.sock (default: cgpu, when that group exists)",
                                       kind="string", expects="a group name", rule=_group, metavar="GROUP",
                                       restart=True)
    client_group: str | None = setting(None, "the older name of socket_group", kind="string", expects="a group name",
                                       rule=_group, metavar="GROUP", restart=True)
    admin_mode: int = setting(0o600, "file mode of admin.sock", kind="mode", flag=False, restart=True)
    admin_group: str | None = setting(None, "group owning admin.sock", kind="string", expects="a group name",
                                      rule=_group, metavar="GROUP", restart=True)
    admin_listen: str | None = setting(None, "also serve the admin API on loopback 127.0.0.1:PORT; requests need "
                                       "'Authorization: Bearer <state-dir/admin.token>'", kind="string",
                                       expects="a loopback HOST:PORT", rule=_loopback, metavar="127.0.0.1:PORT",
                                       restart=True)
    metrics_listen: str | None = setting(None, "also serve GET /metrics, and nothing else, with no token, on "
                                         "HOST:PORT (0.0.0.0:9447 in a pod: what a Prometheus PodMonitor scrapes); "
                                         "the metrics name every instance's pod", kind="string",
                                         expects="a HOST:PORT", rule=_host_port, metavar="HOST:PORT", restart=True)
    max_clients: int = setting(1024, "connections beyond this are refused with an error", 1, LIMIT, "integer",
                               metavar="N")
    client_reserve: int = setting(64, "of max_clients, the slots kept for tenants that hold fewer than 4 "
                                  "connections (at most half of max_clients): however many connections the others "
                                  "hold, a new tenant still connects",
                                  0, LIMIT, "integer", metavar="N")
    max_clients_per_uid: int = setting(128, "connections one uid's host processes may hold (root is exempt); beyond "
                                       "it a new one is refused", 1, LIMIT, "integer", metavar="N")
    max_clients_per_instance: int = setting(256, "connections one instance (a container, or a host instance) may "
                                            "hold; beyond it a new one is refused", 1, LIMIT, "integer", metavar="N")
    max_records_per_uid: int = setting(64, "instance records one uid's host processes may make by registering "
                                       "(root is exempt; provisioned records do not count)", 1, LIMIT, "integer",
                                       metavar="N")
    max_admin_clients: int = setting(64, "connections the admin API holds at once from the loopback TCP "
                                     "listener, and apart from them from admin.sock peers it refuses; beyond it a new "
                                     "one is closed at once (the host's admin.sock peers are never refused)", 1, 4096,
                                     "integer", metavar="N")
    admin_request_timeout_s: float = setting(5.0, "close an admin connection that sends no complete request this "
                                             "long after it connected or after its last answer (s)", 0, 3600,
                                             "seconds", lo_open=True, metavar="S")
    idle_timeout_s: float = _seconds(30.0, "close a connection that said hello but has not registered this long (s)")
    max_unread_bytes: int = setting(1 << 20, "close a connection whose replies it has not read pass this many bytes "
                                    "(its buffer is freed)", 64 << 10, 1 << 30, "integer", metavar="BYTES")
    handshake_timeout_s: float = _seconds(5.0, "drop a client that sends no hello this long (s)")
    frame_timeout_s: float = _seconds(5.0, "drop a client that leaves a frame half-sent this long (s)")
    log_level: str = setting("info", "debug, info, warning or error", kind="choice", choices=LOG_LEVELS)
    realtime_priority: int = setting(0, "run under SCHED_FIFO priority N, 1..99, so a grant goes out as soon as its "
                                     "request arrives (0: normal scheduling); without CAP_SYS_NICE (or "
                                     "RLIMIT_RTPRIO of N) it logs one warning and runs at normal priority",
                                     *PRIORITY_RANGE, "integer", metavar="N", restart=True)
    nvml_poll_ms: int = setting(500, "how often NVML's process lists and utilization are read, to see, charge "
                                "and stop GPU work that bypasses the interposer (ms)", 50, 60_000, "integer",
                                metavar="MS")
    unmanaged_allow: str | None = setting(None, "processes exempt from the unmanaged setting (host daemons, "
                                          "monitoring agents): comma-separated executables of host processes "
                                          "run by root (/usr/bin/nv-hostengine) or cgroups, each with everything "
                                          "below it (/system.slice/dcgm.service)",
                                          kind="string", expects="absolute paths, separated by commas",
                                          rule=_allow_list, metavar="PATHS")
    gpu: GpuSettings = field(default_factory=GpuSettings)
    source: str | None = field(default=None, repr=False)

    def gpu_settings(self) -> GpuSettings:
        """A fresh copy of the per-GPU defaults."""
        return GpuSettings(**{name: getattr(self.gpu, name) for name in GPU})


OPTIONS: dict[str, Setting[Any]] = table(Config, "daemon", flag=True, toml=True)
SETTINGS: tuple[Setting[Any], ...] = (*OPTIONS.values(), *GPU.values())  # every key of the file


def from_mapping(data: dict[str, Any]) -> tuple[Config, list[str]]:
    """A config from ``data`` (TOML keys: options and per-GPU settings); every error found."""
    cfg = Config()
    errs = configfile.apply(data, [(cfg.gpu, GPU), (cfg, OPTIONS)])
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


LOADER = configfile.Loader(from_mapping)
load = LOADER.load  # (path, overrides) -> Config; raises SettingError listing every error, "; " between them
check_file = LOADER.check_file  # every error in the file at path, one per line (empty when valid)


def default_memsize(cfg: Config) -> int:
    """The node-wide default_memsize the daemon starts with (bytes)."""
    return cfg.default_memsize

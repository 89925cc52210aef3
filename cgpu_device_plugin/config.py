"""Plugin configuration: a TOML file, overridden by the flags that were given.

Every setting of ``cgpu-device-plugin`` is declared once, as a field of
:class:`Config` that is a :class:`~arbiterd.core.setting.Setting`; its flags,
``--check-config``, the man page and the documents' table are derived from
these declarations, as arbiterd's are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arbiterd.cli import configfile
from arbiterd.cli.entry import LOG_LEVELS
from arbiterd.core.errors import SettingError
from arbiterd.core.setting import Setting, setting, table

PLACEMENTS = ("binpack", "spread")
__all__ = ["LOADER", "LOG_LEVELS", "PLACEMENTS", "SETTINGS", "Config", "ConfigError", "check_file",
           "from_mapping", "load"]


class ConfigError(SettingError):
    """One or more settings are invalid; the message lists each on its own line."""


def _absolute(v: str) -> str | None:
    return None if v.startswith("/") and "\0" not in v and "\n" not in v else "an absolute path"


def _below_root(v: str) -> str | None:
    return _absolute(v) or (None if v.rstrip("/") else "a directory below /")


NODE_NAME_ENV = "$NODE_NAME"
IN_CLUSTER = "in-cluster"


def _node_name(v: str) -> str | None:
    ok = v in ("", NODE_NAME_ENV) or re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", v)
    return None if ok else "a node name (a DNS subdomain), $NODE_NAME or empty"


def _url(v: str) -> str | None:
    return None if v == IN_CLUSTER or re.fullmatch(r"https?://[^\s]+", v) else "in-cluster or an http(s) URL"


def _path(default: str, metavar: str, help: str) -> Any:
    return setting(default, help, kind="path", expects="an absolute path", rule=_absolute, metavar=metavar)


def _seconds(default: float, lo: float, hi: float, help: str) -> Any:
    return setting(default, help, lo, hi, "seconds", metavar="S")


@dataclass(slots=True)
class Config:
    """Every setting of ``cgpu-device-plugin``. Field names are the TOML keys."""

    kubelet_dir: str = _path("/var/lib/kubelet/device-plugins", "DIR",
                             "the kubelet's device-plugins dir; the plugin serves cgpu-mem.sock and cgpu-core.sock")
    admin_socket: str = _path("/run/cgpu/admin.sock", "PATH", "arbiterd's admin.sock")
    socket_dir: str = _path("/run/cgpu", "DIR", "host dir holding arbiter.sock, mounted read-only at /run/cgpu")
    libcgpu: str = _path("/usr/local/lib/cgpu/libcgpu.so", "PATH",
                         "host path of libcgpu.so, mounted read-only at the same path")
    alloc_dir: str = _path("/var/lib/cgpu/alloc", "DIR", "host dir of allocation tokens and state.json")
    alloc_mount: str = setting("/run/cgpu-alloc", "where containers see allocation dirs; arbiterd's alloc_mount "
                               "must match", kind="path", expects="an absolute path", rule=_below_root,
                               metavar="DIR")
    pod_resources_socket: str = _path("/var/lib/kubelet/pod-resources/kubelet.sock", "PATH",
                                      "the kubelet's PodResources API (v1), read to name the pod and container of "
                                      "each allocation in arbiterd")
    node_name: str = setting(NODE_NAME_ENV, "this node's name, to read its pods' cgpu.io/core-limit annotations (a "
                             "core percentage's ceiling) from the API server; $NODE_NAME: that variable, which the "
                             "DaemonSet sets from spec.nodeName; empty (or $NODE_NAME unset): no limits are read",
                             kind="string", expects="a node name, $NODE_NAME or empty", rule=_node_name,
                             metavar="NAME")
    kube_server: str = setting(IN_CLUSTER, "the API server: in-cluster (the pod's service account, else "
                               "~/.kube/config) or its URL", kind="string", expects="in-cluster or an http(s) URL",
                               rule=_url, metavar="URL")
    placement: str = setting("binpack", "binpack: the fullest card that fits; spread: the emptiest", kind="choice",
                             choices=PLACEMENTS)
    log_level: str = setting("info", "debug, info, warning or error", kind="choice", choices=LOG_LEVELS)
    poll_interval_s: float = _seconds(2.0, 0.01, 3600.0, "how often arbiterd's status is read")
    watch_interval_s: float = _seconds(1.0, 0.01, 3600.0, "how often kubelet.sock is checked")
    pair_window_s: float = _seconds(5.0, 0.0, 600.0, "how long a container's first resource waits for its pair")
    source: str | None = field(default=None, repr=False)

    @property
    def kubelet_socket(self) -> Path:
        return Path(self.kubelet_dir) / "kubelet.sock"


SETTINGS: dict[str, Setting[Any]] = table(Config, "plugin", flag=True, toml=True)


def from_mapping(data: dict[str, Any]) -> tuple[Config, list[str]]:
    """A config built from ``data`` over the defaults, and every error found."""
    cfg = Config()
    return cfg, configfile.apply(data, [(cfg, SETTINGS)])


LOADER = configfile.Loader(from_mapping, "\n", ConfigError)
load = LOADER.load  # (path, overrides) -> Config; raises ConfigError listing every error, one a line
check_file = LOADER.check_file  # every error in the file at path, one per line (empty when valid)

"""``cgpu-device-plugin``: the command line."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

from cgpu_device_plugin import __version__
from cgpu_device_plugin import config as config_mod


def _path(metavar: str, help: str) -> dict[str, Any]:
    return {"metavar": metavar, "help": help}


def _seconds(help: str) -> dict[str, Any]:
    return {"type": float, "metavar": "S", "help": help}


FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--kubelet-dir", "kubelet_dir",
     _path("DIR", "the kubelet's device-plugins dir (default /var/lib/kubelet/device-plugins)")),
    ("--admin-socket", "admin_socket", _path("PATH", "arbiterd's admin.sock (default /run/cgpu/admin.sock)")),
    ("--socket-dir", "socket_dir",
     _path("DIR", "host dir holding arbiter.sock, mounted at /run/cgpu (default /run/cgpu)")),
    ("--libcgpu", "libcgpu",
     _path("PATH", "host path of libcgpu.so to mount (default /usr/local/lib/cgpu/libcgpu.so)")),
    ("--alloc-dir", "alloc_dir", _path("DIR", "host dir of allocation tokens and state (default /var/lib/cgpu/alloc)")),
    ("--alloc-mount", "alloc_mount", _path("DIR", "where containers see allocation dirs (default /run/cgpu-alloc)")),
    ("--placement", "placement", {"choices": list(config_mod.PLACEMENTS), "help": "default binpack"}),
    ("--log-level", "log_level", {"choices": list(config_mod.LOG_LEVELS), "help": "default info"}),
    ("--poll-interval-s", "poll_interval_s", _seconds("how often arbiterd's status is read (default 2)")),
    ("--watch-interval-s", "watch_interval_s", _seconds("how often kubelet.sock is checked (default 1)")),
    ("--pair-window-s", "pair_window_s",
     _seconds("how long a container's first resource waits for its pair (default 5)")),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpu-device-plugin",
                                description="Kubernetes device plugin selling GPU memory (aliyun.com/gpu-mem) and "
                                            "GPU-core percentages (aliyun.com/gpu-core.percentage) on arbiterd.")
    p.add_argument("--config", metavar="FILE", help="TOML config file; flags override it")
    p.add_argument("--check-config", metavar="FILE",
                   help="validate FILE and exit 0, or exit 1 printing each error on one line")
    for flag, dest, kw in FLAGS:
        p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--version", action="version", version=f"cgpu-device-plugin {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check_config:
        errors = config_mod.check_file(args.check_config)
        for err in errors:
            print(err)
        if not errors:
            print(f"{args.check_config}: ok")
        return 1 if errors else 0
    overrides = {dest: getattr(args, dest) for _, dest, _ in FLAGS if getattr(args, dest) is not None}
    try:
        cfg = config_mod.load(args.config, overrides)
    except config_mod.ConfigError as exc:
        for line in str(exc).splitlines():
            print(f"cgpu-device-plugin: {line}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from cgpu_device_plugin.plugin import Plugin  # grpc is imported only when the plugin really runs

    log = logging.getLogger("cgpu_device_plugin")
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            raise SystemExit(1)
        log.info("%s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    plugin = Plugin(cfg)
    try:
        plugin.start()
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    try:
        while not stop.wait(3600):
            pass
    finally:
        plugin.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``cgpu-device-plugin``: the command line. Its flags are made from the plugin's settings."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from types import FrameType
from typing import Protocol

from arbiterd.cli.entry import configure
from arbiterd.cli.flags import add_config_flags, add_setting_flags, overrides
from cgpu_device_plugin import __version__
from cgpu_device_plugin import config as config_mod


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpu-device-plugin",
                                description="Kubernetes device plugin selling GPU memory (aliyun.com/gpu-mem) and "
                                            "GPU-core percentages (aliyun.com/gpu-core.percentage) on arbiterd.")
    add_config_flags(p)
    add_setting_flags(p, config_mod.SETTINGS.values())
    p.add_argument("--version", action="version", version=f"cgpu-device-plugin {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags = overrides(args, config_mod.SETTINGS.values())
    cfg = configure("cgpu-device-plugin", args, config_mod.check_file, config_mod.load, flags)
    if isinstance(cfg, int):
        return cfg
    from cgpu_device_plugin.plugin import Plugin  # grpc is imported only when the plugin really runs

    return serve(Plugin(cfg), logging.getLogger("cgpu_device_plugin"))


class Servable(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


def serve(plugin: Servable, log: logging.Logger) -> int:
    """Start ``plugin`` and serve until SIGTERM or SIGINT (a second one exits at once), then stop it; the exit
    code (1 when it could not start). The DRA plugin's command serves the same way."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if stop.is_set():
            log.warning("second signal: exiting at once")
            raise SystemExit(1)
        log.info("%s: shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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

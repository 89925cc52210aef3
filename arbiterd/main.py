"""``arbiterd``: the command line of the daemon. Its flags are made from the option and per-GPU settings."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from arbiterd import __version__
from arbiterd.cli.entry import configure
from arbiterd.cli.flags import add_config_flags, add_setting_flags
from arbiterd.cli.flags import overrides as given
from arbiterd.core.errors import CoreError
from arbiterd.core.settings import GPU
from arbiterd.server import config as config_mod
from arbiterd.server.realtime import apply_realtime


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="arbiterd",
        description="cgpu node daemon: hands out GPU time slices to containers and keeps their memory limits.",
        epilog="Flags override the config file. Per-GPU flags set the default of every GPU; the settings "
               "tree changes one GPU at run time (cgpuctl).",
    )
    add_config_flags(p)
    add_setting_flags(p, config_mod.OPTIONS.values())
    gpu = p.add_argument_group("per-GPU settings", "the default of every GPU (files N/<name> of the settings tree)")
    add_setting_flags(gpu, GPU.values(), detailed=True)
    p.add_argument("--version", action="version", version=f"arbiterd {__version__}")
    return p


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line gave."""
    return given(args, config_mod.SETTINGS)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    flags = overrides(args)
    cfg = configure("arbiterd", args, config_mod.check_file, config_mod.load, flags)
    if isinstance(cfg, int):
        return cfg
    took, message = apply_realtime(cfg.realtime_priority)
    log = logging.getLogger("arbiterd")
    log.log(logging.WARNING if cfg.realtime_priority and not took else logging.INFO, "%s", message)
    try:
        import uvloop
    except ImportError:
        log.warning("uvloop is not installed; using the default event loop")
        return asyncio.run(_run(cfg, flags))
    return uvloop.run(_run(cfg, flags))


async def _run(cfg: config_mod.Config, flags: dict[str, Any]) -> int:
    from arbiterd.server.daemon import Daemon, StartupError

    log = logging.getLogger("arbiterd")
    try:
        daemon = Daemon(cfg, flags)
        await daemon.start()
    except (StartupError, CoreError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    await daemon.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

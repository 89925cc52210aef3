"""``arbiterd``: the command line of the daemon. Its flags are derived from the config and settings tables."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import typing
from typing import Any

from arbiterd import __version__
from arbiterd.core.errors import CoreError
from arbiterd.core.settings import GPU
from arbiterd.server import config as config_mod
from arbiterd.server.cpu import apply_realtime

_TYPES: dict[Any, type] = {"int": int, "float": float}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _default(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return f" (default {'on' if value else 'off'})"
    return f" (default {value})"


def _escape(text: str) -> str:
    return text.replace("%", "%%")  # argparse formats help with %


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="arbiterd",
        description="cgpu node daemon: hands out GPU time slices to containers and keeps their memory limits.",
        epilog="Flags override the config file. Per-GPU flags set the default of every GPU; the settings "
               "tree changes one GPU at run time (cgpuctl).",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file; flags given here override it")
    p.add_argument("--check-config", metavar="FILE",
                   help="validate FILE and exit 0, or exit 1 printing each error on one line")
    hints = typing.get_type_hints(config_mod.Config)
    for name, f in config_mod.OPTIONS.items():
        meta = f.metadata
        if not meta["flag"]:
            continue
        helptext = _escape(meta["help"] + _default(f.default))
        if hints[name] is bool:
            p.add_argument(_flag(name), dest=name, action=argparse.BooleanOptionalAction, default=None,
                           help=helptext)
            continue
        kind = _TYPES.get(getattr(hints[name], "__name__", ""), str)
        p.add_argument(_flag(name), dest=name, default=None, type=kind, metavar=meta["metavar"],
                       choices=meta["choices"], help=helptext)
    gpu = p.add_argument_group("per-GPU settings", "the default of every GPU (files N/<name> of the settings tree)")
    for name, s in GPU.items():
        gpu.add_argument(_flag(name), dest=name, default=None, metavar="N|auto" if s.kind == "auto" else "N",
                         help=_escape(f"{s.help} ({s.expected}; default {s.format(s.default)})"))
    p.add_argument("--version", action="version", version=f"arbiterd {__version__}")
    return p


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The config keys the command line gave."""
    names = [*config_mod.OPTIONS, *GPU]
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check_config:
        errors = config_mod.check_file(args.check_config)
        for err in errors:
            print(err)
        if not errors:
            print(f"{args.check_config}: ok")
        return 1 if errors else 0
    flags = overrides(args)
    try:
        cfg = config_mod.load(args.config, flags)
    except CoreError as exc:
        print(f"arbiterd: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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

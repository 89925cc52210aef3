"""``arbiterd``: the command line of the daemon."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import Any

from arbiterd import __version__
from arbiterd.core.errors import CoreError
from arbiterd.server import config as config_mod
from arbiterd.server.cpu import apply_realtime

FLAGS: list[tuple[str, str, dict[str, Any]]] = [
    ("--run-dir", "run_dir", {"metavar": "DIR", "help": "holds arbiter.sock and admin.sock (default /run/cgpu)"}),
    ("--state-dir", "state_dir", {"metavar": "DIR", "help": "persistent settings (default /var/lib/cgpu)"}),
    ("--sim-gpus", "sim_gpus", {"metavar": "SPEC", "help": "simulate GPUs instead of NVML, e.g. 2x16GiB"}),
    ("--identity", "identity", {"choices": ["cgroup", "declared"],
                                "help": "where instance ids come from (default cgroup)"}),
    ("--proc-root", "proc_root", {"metavar": "DIR", "help": "the /proc to read peer cgroups from"}),
    ("--policy", "policy", {"type": int, "help": "default policy of every GPU, 0..5 (default 1)"}),
    ("--max-inst", "max_inst", {"type": int, "help": "default max_inst, 1..25 (default 16)"}),
    ("--prio-ratio", "prio_ratio", {"type": int, "help": "default prio_ratio, 20..99 (default 50)"}),
    ("--slice-ms", "slice_ms", {"type": int, "help": "slice length in ms, 1..100 (default 5)"}),
    ("--overrun-ms", "overrun_ms", {"type": int,
                                    "help": "cut off a holder this long past its deadline (default 500)"}),
    ("--default-memsize", "default_memsize", {"metavar": "SIZE",
                                              "help": "memory limit of an instance that states none (0: all)"}),
    ("--linger-s", "linger_s", {"type": int, "help": "keep a record without clients this long (default 60)"}),
    ("--admin-listen", "admin_listen", {"metavar": "127.0.0.1:PORT",
                                        "help": "also serve the admin API on loopback TCP (bearer token)"}),
    ("--admin-group", "admin_group", {"metavar": "GROUP", "help": "group owning admin.sock"}),
    ("--client-group", "client_group", {"metavar": "GROUP", "help": "group owning arbiter.sock"}),
    ("--max-clients", "max_clients", {"type": int, "help": "refuse connections beyond this (default 1024)"}),
    ("--log-level", "log_level", {"choices": list(config_mod.LOG_LEVELS), "help": "default info"}),
    ("--realtime-priority", "realtime_priority", {
        "type": int, "metavar": "N",
        "help": "run under SCHED_FIFO priority N, 1..99, so grants go out at once (default 0: normal)"}),
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="arbiterd",
        description="cgpu node daemon: hands out GPU time slices and keeps memory limits.",
    )
    p.add_argument("--config", metavar="FILE", help="TOML config file; flags override it")
    p.add_argument("--check-config", metavar="FILE",
                   help="validate FILE and exit 0, or exit 1 printing each error on one line")
    p.add_argument("--trust-client-env", dest="trust_client_env", action=argparse.BooleanOptionalAction,
                   default=None, help="use a client's environment for instances nobody provisioned")
    for flag, dest, kw in FLAGS:
        p.add_argument(flag, dest=dest, default=None, **kw)
    p.add_argument("--version", action="version", version=f"arbiterd {__version__}")
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
    if args.trust_client_env is not None:
        overrides["trust_client_env"] = args.trust_client_env
    try:
        cfg = config_mod.load(args.config, overrides)
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
        return asyncio.run(_run(cfg))
    return uvloop.run(_run(cfg))


async def _run(cfg: config_mod.Config) -> int:
    from arbiterd.server.daemon import Daemon, StartupError

    log = logging.getLogger("arbiterd")
    try:
        daemon = Daemon(cfg)
        await daemon.start()
    except (StartupError, CoreError) as exc:
        log.error("cannot start: %s", exc)
        return 1
    await daemon.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())

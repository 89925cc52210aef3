"""``cgpu-dra-plugin``: the command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields

from cgpu_device_plugin.main import serve
from cgpu_dra_plugin import DRIVER, __version__
from cgpu_dra_plugin.config import Config

_HELP = {
    "node_name": "this node's name (default $NODE_NAME): the slice's nodeName and pool",
    "driver": "the DRA driver name", "registry_dir": "the kubelet's plugin registration dir",
    "plugin_dir": "dir of the DRA socket (dra.sock)", "admin_socket": "arbiterd's admin.sock",
    "socket_dir": "host dir holding arbiter.sock, mounted read-only at /run/cgpu",
    "libcgpu": "host path of libcgpu.so, mounted read-only and preloaded",
    "state_dir": "host dir of checkpoint.json and the allocations' tokens (root only)",
    "alloc_mount": "where containers see token dirs; arbiterd's alloc_mount must match",
    "cdi_dir": "where the container runtime reads CDI specs",
    "kubeconfig": "kubeconfig file; without it, the pod's service account, else ~/.kube/config",
    "server": "the API server's URL, bypassing any kubeconfig",
    "poll_interval_s": "seconds between reads of arbiterd's status",
    "gc_interval_s": "seconds between checks of prepared claims against the API server",
    "watch_interval_s": "seconds between checks of the registration socket",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpu-dra-plugin",
                                description=f"Kubernetes DRA kubelet plugin ({DRIVER}): publishes each GPU once "
                                            "with consumable memory and cores, and prepares claims on arbiterd.")
    defaults = Config(node_name="")
    for f in fields(Config):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        kind = float if isinstance(default, float) else str
        p.add_argument(flag, type=kind, default=default if f.name != "node_name" else os.environ.get("NODE_NAME"),
                       help=f"{_HELP[f.name]} (default {default!r})" if f.name != "node_name" else _HELP[f.name])
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                   help="what to log (default 'info')")
    p.add_argument("--version", action="version", version=f"cgpu-dra-plugin {__version__}")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("cgpu_dra_plugin")
    if not args.node_name:
        print("cgpu-dra-plugin: give --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
              file=sys.stderr)
        return 2
    for name in ("poll_interval_s", "gc_interval_s", "watch_interval_s"):
        if not 0.01 <= getattr(args, name) <= 3600:
            print(f"cgpu-dra-plugin: --{name.replace('_', '-')} must be 0.01..3600 seconds", file=sys.stderr)
            return 2
    cfg = Config(**{f.name: getattr(args, f.name) for f in fields(Config)})
    from cgpu_dra_plugin.plugin import Plugin  # grpc and kubernetes are imported only when the plugin runs

    return serve(Plugin(cfg), log)

if __name__ == "__main__":
    sys.exit(main())

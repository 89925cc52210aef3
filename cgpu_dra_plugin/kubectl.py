"""``kubectl-inspect-cgpu`` (``kubectl inspect cgpu``): per node and GPU, memory and cores allocated against
the total, from the ResourceSlices of cgpu-dra-plugin and the claims allocated on them; the cluster's total;
``-d`` lists the pods on each card. It reads the API server through the official client and kubeconfig.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from cgpu_dra_plugin import DRIVER, __version__
from cgpu_dra_plugin.cluster import GpuView, view
from cgpu_dra_plugin.quantity import GIB


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubectl-inspect-cgpu",
                                description="Show cgpu's GPUs (DRA driver gpu.cgpu.io): memory and cores allocated "
                                            "per node and card against the total, from ResourceSlices and claims.")
    p.add_argument("-d", "--details", action="store_true", help="list the pods (claims) on each card")
    p.add_argument("--node", metavar="NAME", help="only this node")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--kubeconfig", metavar="FILE", help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--driver", default=DRIVER, help=f"the DRA driver name (default {DRIVER})")
    p.add_argument("--version", action="version", version=f"kubectl-inspect-cgpu {__version__}")
    return p


def _gib(n: int) -> str:
    return f"{n / GIB:.0f}" if n % GIB == 0 else f"{n / GIB:.1f}"


def _pct(used: int, total: int) -> str:
    return f"{100 * used / total:.0f}%" if total else "-"


def table(gpus: Sequence[GpuView], details: bool) -> str:
    rows = [("NODE", "GPU", "PRODUCT", "MEMORY GiB (used/total)", "CORES % (used/total)", "CLAIMS")]
    for g in gpus:
        rows.append((g.node, f"{g.index} ({g.device})", g.product or "-",
                     f"{_gib(g.memory_used)}/{_gib(g.memory)} ({_pct(g.memory_used, g.memory)})",
                     f"{g.cores_used}/{g.cores} ({_pct(g.cores_used, g.cores)})", str(len(g.uses))))
        if details:
            for u in g.uses:
                who = ", ".join(u.pods) or "(no pod)"
                rows.append(("", "", f"  {u.namespace}/{who}", f"  {_gib(u.memory)}", f"  {u.cores}",
                             f"claim {u.claim}"))
    mem_used, mem = sum(g.memory_used for g in gpus), sum(g.memory for g in gpus)
    cores_used, cores = sum(g.cores_used for g in gpus), sum(g.cores for g in gpus)
    nodes = len({g.node for g in gpus})
    rows.append((f"TOTAL ({nodes} nodes)", f"{len(gpus)} GPUs", "", f"{_gib(mem_used)}/{_gib(mem)} "
                 f"({_pct(mem_used, mem)})", f"{cores_used}/{cores} ({_pct(cores_used, cores)})",
                 str(sum(len(g.uses) for g in gpus))))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from kubernetes.config import ConfigException
    from urllib3.exceptions import HTTPError

    from cgpu_dra_plugin.kubeapi import ApiException, KubeApi, api_client

    try:
        kube = KubeApi(api_client(args.kubeconfig) if args.kubeconfig else api_client(None))
        slices, claims = kube.list_slices(args.driver), kube.list_claims()
    except (ConfigException, OSError, HTTPError) as exc:
        print(f"kubectl-inspect-cgpu: cannot reach the API server: {exc}", file=sys.stderr)
        return 3
    except ApiException as exc:
        print(f"kubectl-inspect-cgpu: the API server refused: {exc.status} {exc.reason}", file=sys.stderr)
        return 1
    gpus = [g for g in view(slices, claims, args.driver) if args.node is None or g.node == args.node]
    if args.json:
        print(json.dumps([{**asdict(g), "memory_used": g.memory_used, "cores_used": g.cores_used} for g in gpus],
                         indent=2))
    else:
        print(table(gpus, args.details))
    return 0


if __name__ == "__main__":
    sys.exit(main())

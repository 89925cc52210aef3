"""``cgpu-smi``: per-GPU and per-instance view of arbiterd, like cGPU's cgpu-smi.

    cgpu-smi [--admin ADDR] [-l SECONDS] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from arbiterd import __version__
from arbiterd.core.settings import format_size
from arbiterd.tools.adminclient import AdminClient, add_admin_args, run_tool


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _slice(g: dict[str, Any]) -> str:
    """``auto 65ms`` or the pinned ``5ms``."""
    eff = f"{g['slice_effective_ms']:g}ms"
    return f"auto {eff}" if g["slice_ms"] == "auto" else eff


def render(doc: dict[str, Any]) -> str:
    out = []
    problem = doc.get("state_problem")
    out.append(f"cgpu-smi {__version__}   arbiterd {doc['version']} (pid {doc['pid']})   "
               f"clients: {doc['clients']}   uptime: {doc['uptime_seconds']:.0f} s")
    if problem:
        out.append(f"WARNING: {problem}")
    out.append("")
    gpu_hdr = f"{'GPU':<4}{'Name':<22}{'Memory used / total':<26}{'Policy':<15}{'max_inst':>9}" \
              f"{'free_weight':>13}{'Slice':>12}{'Handover':>10}{'Busy% 1s':>10}{'60s':>7}"
    out.append(gpu_hdr)
    out.append("-" * len(gpu_hdr))
    for g in doc["gpus"]:
        name = g["name"] + (" (sim)" if g["simulated"] and "Sim" not in g["name"] else "")
        mem = f"{format_size(g['mem_used'])} / {format_size(g['total_mem'])}"
        out.append(f"{g['index']:<4}{name[:21]:<22}{mem:<26}{str(g['policy']) + ' ' + g['policy_name']:<15}"
                   f"{g['max_inst']:>9}{g['free_weight']:>13}{_slice(g):>12}{g['handover_ms']:>8.2f}ms"
                   f"{_pct(g['busy_pct']['1s']):>10}"
                   f"{_pct(g['busy_pct']['60s']):>7}")
    out.append("")
    inst_hdr = f"{'GPU':<4}{'Instance':<16}{'Weight':>7}{'HighPrio':>9}{'Share% 1s':>11}{'60s':>7}" \
               f"  {'Memory used / limit':<26}{'PIDs'}"
    out.append(inst_hdr)
    out.append("-" * len(inst_hdr))
    any_inst = False
    for g in doc["gpus"]:
        for i in g["instances"]:
            any_inst = True
            mem = f"{format_size(i['mem_used'])} / {format_size(i['mem_limit'])}"
            weight = f"{i['weight']}" + ("!" if i["starved"] else "")
            pids = ",".join(str(p) for p in i["pids"]) or "-"
            line = (f"{g['index']:<4}{i['id'][:15]:<16}{weight:>7}{i['highprio']:>9}"
                    f"{_pct(i['share_pct']['1s']):>11}{_pct(i['share_pct']['60s']):>7}  {mem:<26}{pids}")
            if i["starved"]:
                line += "   STARVED: weight 0, no GPU time (free_weight was 0)"
            out.append(line)
    if not any_inst:
        out.append("(no instances)")
    return "\n".join(out) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpu-smi", description="Show the GPUs and instances of arbiterd.")
    add_admin_args(p)
    p.add_argument("-l", "--loop", type=float, metavar="SECONDS", help="refresh every SECONDS until Ctrl-C")
    p.add_argument("--json", action="store_true", help="print the status document as JSON")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.loop is not None and args.loop <= 0:
        p.error("-l: SECONDS must be positive")

    def body() -> int:
        client = AdminClient.from_env(args.admin, args.token_file)
        while True:
            doc = client.status()
            if args.json:
                print(json.dumps(doc, indent=2), flush=True)
            else:
                if args.loop is not None and sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")
                sys.stdout.write(render(doc))
                sys.stdout.flush()
            if args.loop is None:
                return 0
            time.sleep(args.loop)

    return run_tool("cgpu-smi", body)


if __name__ == "__main__":
    sys.exit(main())

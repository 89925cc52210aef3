"""``cgpu-smi``: per-GPU and per-instance view of arbiterd, like cGPU's cgpu-smi.

    cgpu-smi [--admin ADDR] [-l [SECONDS] | --watch [SECONDS]] [--json] [--pod [NAMESPACE/]NAME]

Each instance shows what it was entitled to, what it was delivered (useful
time) and the error (delivered less what it was owed while it had demand), over
1 s and 60 s. On a Kubernetes node, where a plugin named an instance's pod,
the table gains ``Pod`` (``namespace/pod``) and ``Container`` columns, and
``--pod`` keeps that pod's instances alone. With ``-l`` the table refreshes in
place on a terminal (the alternate screen, like ``watch``), and is printed as
plain blocks, one after the other, when the output is piped (``--json``: one
document a line).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from arbiterd import __version__
from arbiterd.core import podlabels
from arbiterd.core.errors import SettingError
from arbiterd.core.settings import format_size
from arbiterd.tools.adminclient import AdminClient, add_admin_args, run_tool


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _signed(v: float | None) -> str:
    """An error in points; ``-`` where the instance had no demand (it cannot be under-served)."""
    return "-" if v is None else f"{v:+.1f}"


def _wait(v: float | None) -> str:
    """A grant wait: ``-`` where nothing was granted in the window."""
    return "-" if v is None else f"{v:.1f}ms" if v < 10 else f"{v:.0f}ms"


def _slice(g: dict[str, Any]) -> str:
    """``auto 65ms`` or the pinned ``5ms``."""
    eff = f"{g['slice_effective_ms']:g}ms"
    return f"auto {eff}" if g["slice_ms"] == "auto" else eff


def pod_of(item: dict[str, Any]) -> tuple[str, str]:
    """An instance's (or unmanaged process's) ``namespace/pod`` and container, ``-`` where it has none."""
    labels = item.get("labels")
    if not labels:
        return "-", "-"
    return f"{labels['namespace']}/{labels['pod']}", labels["container"] or "-"


def pod_matches(item: dict[str, Any], want: str) -> bool:
    """Whether ``item``'s pod is ``want``: ``NAME`` (in any namespace) or ``NAMESPACE/NAME``."""
    labels = item.get("labels")
    if not labels:
        return False
    namespace, _, name = want.rpartition("/")
    return bool(labels["pod"] == name and (not namespace or labels["namespace"] == namespace))


def only_pod(doc: dict[str, Any], want: str) -> dict[str, Any]:
    """``doc`` with only the instances, unmanaged processes and allocations of pod ``want``."""
    gpus = [{**g, "instances": [i for i in g["instances"] if pod_matches(i, want)],
             "unmanaged_processes": [u for u in g.get("unmanaged_processes", []) if pod_matches(u, want)]}
            for g in doc["gpus"]]
    return {**doc, "gpus": gpus, "allocations": [a for a in doc.get("allocations", []) if pod_matches(a, want)]}


def pod_arg(text: str) -> str:
    """``--pod``'s value: a pod name, or ``namespace/name``, each by Kubernetes' rules."""
    namespace, _, name = text.rpartition("/")
    try:
        podlabels.check(namespace or "default", name)
    except SettingError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("namespace=", "").replace("pod=", "")) from None
    return text


def render(doc: dict[str, Any], pod: str | None = None) -> str:
    out = []
    problem = doc.get("state_problem")
    out.append(f"cgpu-smi {__version__}   arbiterd {doc['version']} (pid {doc['pid']})   "
               f"clients: {doc['clients']}   uptime: {doc['uptime_seconds']:.0f} s")
    if problem:
        out.append(f"WARNING: {problem}")
    out.append("")
    gpu_hdr = f"{'GPU':<4}{'Name':<22}{'Memory used / total':<26}{'Policy':<15}{'max_inst':>9}" \
              f"{'free_weight':>13}{'Slice':>12}{'Handover':>10}{'Busy% 1s':>10}{'60s':>7}{'Fair pp 60s':>13}" \
              f"{'Round':>9}"
    out.append(gpu_hdr)
    out.append("-" * len(gpu_hdr))
    for g in doc["gpus"]:
        name = g["name"] + (" (sim)" if g["simulated"] and "Sim" not in g["name"] else "")
        mem = f"{format_size(g['mem_used'])} / {format_size(g['total_mem'])}"
        out.append(f"{g['index']:<4}{name[:21]:<22}{mem:<26}{str(g['policy']) + ' ' + g['policy_name']:<15}"
                   f"{g['max_inst']:>9}{g['free_weight']:>13}{_slice(g):>12}{g['handover_ms']:>8.2f}ms"
                   f"{_pct(g['busy_pct']['1s']):>10}"
                   f"{_pct(g['busy_pct']['60s']):>7}{_pct(g['fairness_error_pp']['60s']):>13}"
                   f"{g['round_ms']:>7.0f}ms")
    out.append("")
    # Pod and Container columns on a node where some instance is a pod's: as wide as the longest name, never cut
    pods = {i["id"]: pod_of(i) for g in doc["gpus"] for i in g["instances"]}
    shown = any(p != ("-", "-") for p in pods.values())
    pod_w = max([len("Pod"), *(len(p) for p, _ in pods.values())]) + 2 if shown else 0
    ctr_w = max([len("Container"), *(len(c) for _, c in pods.values())]) + 2 if shown else 0
    pod_hdr = f"{'Pod':<{pod_w}}{'Container':<{ctr_w}}" if shown else ""
    inst_hdr = f"{'GPU':<4}{'Instance':<16}{pod_hdr}{'Weight':>7}{'HighPrio':>9}{'Entitled% 1s':>14}{'60s':>7}" \
               f"{'Delivered% 1s':>15}{'60s':>7}{'Err pp 1s':>11}{'60s':>7}{'Wait p50':>10}{'p99':>8}  " \
               f"{'Memory used / limit':<26}{'PIDs'}"
    out.append(inst_hdr)
    out.append("-" * len(inst_hdr))
    any_inst = False
    for g in doc["gpus"]:
        for i in g["instances"]:
            any_inst = True
            mem = f"{format_size(i['mem_used'])} / {format_size(i['mem_limit'])}"
            weight = f"{i['weight']}" + ("!" if i["starved"] else "")
            pids = ",".join(str(p) for p in i["pids"]) or "-"
            in_pod = f"{pods[i['id']][0]:<{pod_w}}{pods[i['id']][1]:<{ctr_w}}" if shown else ""
            line = (f"{g['index']:<4}{i['id'][:15]:<16}{in_pod}{weight:>7}{i['highprio']:>9}"
                    f"{_pct(i['entitled_pct']['1s']):>14}{_pct(i['entitled_pct']['60s']):>7}"
                    f"{_pct(i['delivered_pct']['1s']):>15}{_pct(i['delivered_pct']['60s']):>7}"
                    f"{_signed(i['error_pp']['1s']):>11}{_signed(i['error_pp']['60s']):>7}"
                    f"{_wait(i.get('wait_p50_ms')):>10}{_wait(i.get('wait_p99_ms')):>8}  {mem:<26}{pids}")
            if i["starved"]:
                line += "   STARVED: weight 0, no GPU time (free_weight was 0)"
            if i.get("limit", 100) < 100:
                line += f"   LIMIT {i['limit']} %, throttled {i.get('throttled_seconds', 0.0):.1f} s"
            shim = i.get("gang_shim_spin_seconds", 0.0)
            if i.get("gang"):
                line += (f"   GANG on GPUs {','.join(map(str, i['gang']))}, "
                         f"spin {i.get('gang_spin_seconds', 0.0):.2f} s, shim {shim:.2f} s")
            elif shim:  # a job across GPUs that is no gang now (gangs off, or between steps): its spin all the same
                line += f"   SPIN shim {shim:.2f} s"
            out.append(line)
    if not any_inst:
        out.append(f"(no instances of pod {pod})" if pod else "(no instances)")
    out += _unmanaged(doc)
    return "\n".join(out) + "\n"


def _unmanaged(doc: dict[str, Any]) -> list[str]:
    """A row per process with a context on a GPU that is no client of cgpu (NVML's lists), if there is any."""
    rows = [(g, u) for g in doc["gpus"] for u in g.get("unmanaged_processes", [])]
    if not rows:
        return []
    pods = {u["pid"]: pod_of(u)[0] for _, u in rows}
    pod_w = max([len("Pod"), *(len(p) for p in pods.values())]) + 2 if any(p != "-" for p in pods.values()) else 0
    hdr = (f"{'GPU':<4}{'Instance':<16}{'Pod' if pod_w else '':<{pod_w}}{'PID':>8}  {'Memory used':<14}{'Seen':>8}  "
           f"{'State':<22}Executable")
    out = ["", hdr, "-" * len(hdr)]
    for g, u in rows:
        state = "UNMANAGED throttled" if u["throttled"] else "UNMANAGED"
        in_pod = pods[u["pid"]] if pod_w else ""
        out.append(f"{g['index']:<4}{u['instance'][:15]:<16}{in_pod:<{pod_w}}{u['pid']:>8}  "
                   f"{format_size(u['mem_used']):<14}{u['seen_seconds']:>7.0f}s  {state:<22}{u['exe'] or '?'}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cgpu-smi", description="Show the GPUs and instances of arbiterd.")
    add_admin_args(p)
    p.add_argument("-l", "--loop", "--watch", type=float, nargs="?", const=1.0, metavar="SECONDS",
                   help="refresh every SECONDS (default 1) until Ctrl-C: in place on a terminal, as plain "
                        "blocks when piped")
    p.add_argument("--json", action="store_true", help="print the status document as JSON (one a line with -l)")
    p.add_argument("--pod", type=pod_arg, metavar="[NAMESPACE/]NAME",
                   help="only the instances of this Kubernetes pod (in any namespace, unless one is given), as the "
                        "plugin that allocated them named it; with --json, the document holds only those")
    return p


ALT_SCREEN, MAIN_SCREEN = "\x1b[?1049h\x1b[?25l", "\x1b[?25h\x1b[?1049l"


def frame(text: str) -> str:
    """``text`` drawn over the previous frame: home, each line cleared to its end, the rest of the screen cleared."""
    return "\x1b[H" + "".join(line + "\x1b[K\n" for line in text.splitlines()) + "\x1b[J"


def stamped(doc: dict[str, Any], pod: str | None = None) -> str:
    return time.strftime("%a %b %d %H:%M:%S %Y") + "\n" + render(doc, pod)


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.loop is not None and args.loop <= 0:
        p.error("-l: SECONDS must be positive")
    in_place = args.loop is not None and not args.json and sys.stdout.isatty()

    def body() -> int:
        client = AdminClient.from_env(args.admin, args.token_file)
        if in_place:
            sys.stdout.write(ALT_SCREEN)
        try:
            first = True
            while True:
                doc = client.status()
                if args.pod is not None:
                    doc = only_pod(doc, args.pod)
                if args.json:
                    print(json.dumps(doc) if args.loop is not None else json.dumps(doc, indent=2), flush=True)
                elif args.loop is None:
                    sys.stdout.write(render(doc, args.pod))
                elif in_place:
                    sys.stdout.write(frame(stamped(doc, args.pod)))
                else:
                    sys.stdout.write(("" if first else "\n") + stamped(doc, args.pod))
                sys.stdout.flush()
                first = False
                if args.loop is None:
                    return 0
                time.sleep(args.loop)
        finally:
            if in_place:
                sys.stdout.write(MAIN_SCREEN)
                sys.stdout.flush()

    return run_tool("cgpu-smi", body)


if __name__ == "__main__":
    sys.exit(main())

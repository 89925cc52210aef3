"""The main job: arbiterd on a simulated GPU, and two instances sharing it with weights 1:2.

    python examples/demo.py [--seconds 8]        (from the checkout, with its venv's Python)

Starts the daemon in a temporary directory (no root, no GPU needed), runs two
client processes that busy-spin 1 ms "GPU operations" through the slice gate
(cgpu_testing/spin.py), shows ``cgpu-smi`` and a ``cgpuctl`` session while they
run, and prints the share of GPU time each got. Everything is stopped and
removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout: pip leaves cgpu_testing out

from cgpu_testing.daemon import DaemonProc
from cgpu_testing.tools import ROOT, root_on_path, tool

JOBS = (("job-a", 1), ("job-b", 2))  # (instance, weight)


def _times(d: DaemonProc) -> dict[str, tuple[float, float]]:
    """Each instance's (useful, held) seconds: useful is what it is billed, held less its hand-overs."""
    return {i["id"]: (i["useful_seconds"], i["held_seconds"]) for g in d.smi_json()["gpus"] for i in g["instances"]}


def _b_over_a(x: dict[str, float]) -> str:
    """job-b's figure over job-a's, as the demo prints it."""
    return f"{x['job-b'] / x['job-a']:.2f}"


def _show(d: DaemonProc, *cmd: str) -> None:
    """Run an operator tool against ``d`` and print the session as a terminal shows it."""
    print(f"\n$ {' '.join(cmd)}", flush=True)
    proc = subprocess.run([tool(cmd[0]), "--admin", d.admin, *cmd[1:]], capture_output=True, text=True)
    sys.stdout.write(proc.stdout + proc.stderr)
    if cmd[:2] == ("cgpuctl", "echo"):
        print(f"(exit code {proc.returncode}: the value is refused and nothing changes)")


def share(d: DaemonProc, seconds: float) -> None:
    """Provision the two jobs, run them, show the tools while they run, and print what each got."""
    uid = os.geteuid()  # the two jobs run on this host as this user: an operator provisions them for it
    for name, weight in JOBS:
        print(f"$ cgpuctl echo \"create {name} uid={uid} weight={weight}\" inst_ctl", flush=True)
        d.echo(f"create {name} uid={uid} weight={weight}", "inst_ctl")
    clients = {name: subprocess.Popen([sys.executable, "-m", "cgpu_testing.spin", d.sock, name, str(seconds), "1.0",
                                       str(weight)], stdout=subprocess.PIPE, text=True, env=root_on_path(), cwd=ROOT)
               for name, weight in JOBS}
    deadline = time.monotonic() + 30
    while set(_times(d)) != {"job-a", "job-b"} and time.monotonic() < deadline:
        time.sleep(0.1)  # the window opens only once both instances are registered
    time.sleep(0.5)
    first, w0 = _times(d), time.monotonic_ns()
    time.sleep(max(1.0, seconds - 3.0))
    second, w1 = _times(d), time.monotonic_ns()
    for cmd in (("cgpu-smi",), ("cgpuctl", "ls", "0"), ("cgpuctl", "cat", "0/job-b/weight"),
                ("cgpuctl", "echo", "9", "0/policy")):
        _show(d, *cmd)
    work = {}  # each client's operation time inside the window: what it got done
    for name, client in clients.items():
        out, _ = client.communicate(timeout=seconds + 30)
        spans = json.loads(out.splitlines()[-1])["intervals"]
        work[name] = sum(max(0, min(e, w1) - max(s, w0)) for s, e in spans) / 1e9
    billed, held = ({n: second[n][k] - first[n][k] for n in work} for k in (0, 1))
    print(f"\nWhile both ran ({seconds - 3.0:.0f} s window, weights 1:2, policy 2, slice_ms auto):")
    print(f"  {'':17} {'work done':>9} {'share':>7} {'billed':>8} {'held':>8}")
    for n, label in (("job-a", "job-a (weight 1)"), ("job-b", "job-b (weight 2)")):
        print(f"  {label}: {work[n]:7.2f} s  {100 * work[n] / sum(work.values()):5.1f} %  "
              f"{billed[n]:6.2f} s  {held[n]:6.2f} s")
    print(f"  work done b/a = {_b_over_a(work)} (target 2.00); billed (useful time) {_b_over_a(billed)}; "
          f"held {_b_over_a(held)}, as each turn also holds its hand-over")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python examples/demo.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="how long the two instances run")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-demo-"))
    daemon = DaemonProc(tmp, "--sim-gpus", "1x16GiB", "--policy", "2")
    print("$ arbiterd " + " ".join(daemon.command()[1:]))
    try:
        with daemon:
            share(daemon, args.seconds)
    except RuntimeError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

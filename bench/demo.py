"""The main job: arbiterd on a simulated GPU, and two instances sharing it with weights 1:2.

    python -m bench.demo [--seconds 8]

Starts the daemon in a temporary directory (no root, no GPU needed), runs two
client processes that busy-spin 1 ms "GPU operations" through the slice gate,
shows ``cgpu-smi`` and a ``cgpuctl`` session while they run, and prints the
share of GPU time each got. Everything is stopped and removed at the end.
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

from bench.common import ROOT, tool
from libcgpu_client.client import wait_for_socket


def _times(admin: str) -> dict[str, tuple[float, float]]:
    """Each instance's (useful, held) seconds: useful is what it is billed, held less its hand-overs."""
    out = subprocess.run([tool("cgpu-smi"), "--admin", admin, "--json"], capture_output=True, text=True,
                         check=True).stdout
    return {i["id"]: (i["useful_seconds"], i["held_seconds"]) for g in json.loads(out)["gpus"]
            for i in g["instances"]}


def _b_over_a(x: dict[str, float]) -> str:
    """job-b's figure over job-a's, as the demo prints it."""
    return f"{x['job-b'] / x['job-a']:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=8.0, help="how long the two instances run")
    args = p.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="cgpu-demo-"))
    run_dir, state_dir = tmp / "run", tmp / "state"
    sock, admin = str(run_dir / "arbiter.sock"), str(run_dir / "admin.sock")
    print(f"$ arbiterd --run-dir {run_dir} --state-dir {state_dir} --sim-gpus 1x16GiB --policy 2")
    daemon = subprocess.Popen([tool("arbiterd"), "--run-dir", str(run_dir), "--state-dir", str(state_dir),
                               "--sim-gpus", "1x16GiB", "--policy", "2"],
                              stderr=open(tmp / "arbiterd.log", "w"))  # noqa: SIM115 (closed with the daemon)
    try:
        if not wait_for_socket(sock, 15) or not wait_for_socket(admin, 15):
            print("demo: arbiterd did not start", file=sys.stderr)
            return 1
        uid = os.geteuid()  # the two jobs run on this host as this user: an operator provisions them for it
        for name, weight in (("job-a", 1), ("job-b", 2)):
            cmd = ["cgpuctl", "echo", f"create {name} uid={uid} weight={weight}", "inst_ctl"]
            print(f"$ cgpuctl echo \"create {name} uid={uid} weight={weight}\" inst_ctl", flush=True)
            subprocess.run([tool(cmd[0]), "--admin", admin, *cmd[1:]], check=True)
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        clients = {
            name: subprocess.Popen([sys.executable, "-m", "bench.spin", sock, name, str(args.seconds), "1.0",
                                    str(weight)], stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
            for name, weight in (("job-a", 1), ("job-b", 2))
        }
        deadline = time.monotonic() + 30
        while set(_times(admin)) != {"job-a", "job-b"} and time.monotonic() < deadline:
            time.sleep(0.1)  # the window opens only once both instances are registered
        time.sleep(0.5)
        first, w0 = _times(admin), time.monotonic_ns()
        time.sleep(max(1.0, args.seconds - 3.0))
        second, w1 = _times(admin), time.monotonic_ns()
        for cmd in (["cgpu-smi"], ["cgpuctl", "ls", "0"], ["cgpuctl", "cat", "0/job-b/weight"],
                    ["cgpuctl", "echo", "9", "0/policy"]):
            print(f"\n$ {' '.join(cmd)}", flush=True)
            proc = subprocess.run([tool(cmd[0]), "--admin", admin, *cmd[1:]], capture_output=True, text=True)
            sys.stdout.write(proc.stdout + proc.stderr)
            if cmd[0] == "cgpuctl" and cmd[1] == "echo":
                print(f"(exit code {proc.returncode}: the value is refused and nothing changes)")
        work = {}  # each client's operation time inside the window: what it got done
        for name, client in clients.items():
            out, _ = client.communicate(timeout=args.seconds + 30)
            spans = json.loads(out.splitlines()[-1])["intervals"]
            work[name] = sum(max(0, min(e, w1) - max(s, w0)) for s, e in spans) / 1e9
        billed, held = ({n: second[n][k] - first[n][k] for n in work} for k in (0, 1))
        print(f"\nWhile both ran ({args.seconds - 3.0:.0f} s window, weights 1:2, policy 2, slice_ms auto):")
        print(f"  {'':17} {'work done':>9} {'share':>7} {'billed':>8} {'held':>8}")
        for n, label in (("job-a", "job-a (weight 1)"), ("job-b", "job-b (weight 2)")):
            print(f"  {label}: {work[n]:7.2f} s  {100 * work[n] / sum(work.values()):5.1f} %  "
                  f"{billed[n]:6.2f} s  {held[n]:6.2f} s")
        print(f"  work done b/a = {_b_over_a(work)} (target 2.00); billed (useful time) {_b_over_a(billed)}; "
              f"held {_b_over_a(held)}, as each turn also holds its hand-over")
        return 0
    finally:
        daemon.terminate()
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

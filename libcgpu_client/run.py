"""``cgpu-run``: run a program under the cgpu interposer with the given settings.

    cgpu-run [--gpus LIST] [--weight N] [--mem SIZE] [--highprio] [--instance ID]
             [--device auto|cuda|cpu] [--socket PATH] [--on-daemon-loss wait|run]
             [--idle-ms MS] -- CMD [ARGS...]

It sets the environment of SPEC §6 and puts a start-up hook on PYTHONPATH, so
that ``cgpu-run -- python train.py`` is arbitrated with no code change.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

from libcgpu_client.boot import BOOT_DIR
from libcgpu_client.env import GIB, EnvError, parse_env, parse_size_list

_CONTAINER = re.compile(r"(docker|containerd|crio|kubepods|libpod)", re.IGNORECASE)


def in_container(proc_self_cgroup: str = "/proc/self/cgroup") -> bool:
    try:
        return bool(_CONTAINER.search(Path(proc_self_cgroup).read_text()))
    except OSError:
        return False


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cgpu-run",
        description="Run CMD under the cgpu interposer: its GPU work waits for slice leases from "
                    "arbiterd and its GPU memory is held to a limit.",
        epilog="Example: cgpu-run --device cpu --weight 2 --mem 1GiB -- python train.py",
    )
    p.add_argument("--gpus", metavar="LIST", help="visible GPUs: indices 0,1 or UUIDs (default 0)")
    p.add_argument("--weight", type=int, metavar="N", help="scheduling weight 1..max_inst (default 1)")
    p.add_argument("--mem", metavar="SIZE", help="memory limit per GPU: 3 (GiB), 600MiB, or 1GiB,2GiB")
    p.add_argument("--highprio", action="store_true", help="run as a high-priority instance")
    p.add_argument("--instance", metavar="ID", help="instance id to declare (processes outside containers; "
                   "default run-<pid of cgpu-run>)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"],
                   help="cpu: the CPU acts as the simulated GPU, its operators are gated (default auto)")
    p.add_argument("--socket", metavar="PATH", help="arbiter.sock (default /run/cgpu/arbiter.sock)")
    p.add_argument("--on-daemon-loss", choices=["wait", "run"],
                   help="while arbiterd is unreachable: wait (default) or run unchecked")
    p.add_argument("--idle-ms", metavar="MS", help="give an unused lease back after MS (default 3)")
    p.add_argument("--native", action="store_true",
                   help="preload libcgpu.so to gate the CUDA driver API (not implemented yet)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the program and its arguments")
    return p


def build_env(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if args.gpus is not None:
        env["ALIYUN_COM_GPU_VISIBLE_DEVICES"] = args.gpus
    if args.weight is not None:
        env["ALIYUN_COM_GPU_SCHD_WEIGHT"] = str(args.weight)
    if args.highprio:
        env["ALIYUN_COM_GPU_HIGH_PRIO"] = "1"
    if args.mem is not None:
        mem = args.mem.strip()
        if re.fullmatch(r"\d+(,\d+)*", mem):
            env["ALIYUN_COM_GPU_MEM_CONTAINER"] = mem
            env.pop("CGPU_MEM_LIMIT", None)
        else:
            sizes = parse_size_list("--mem", mem)
            env["CGPU_MEM_LIMIT"] = mem
            if all(s % GIB == 0 for s in sizes):
                env["ALIYUN_COM_GPU_MEM_CONTAINER"] = ",".join(str(s // GIB) for s in sizes)
    if args.instance is not None:
        env["CGPU_INSTANCE"] = args.instance
    elif "CGPU_INSTANCE" not in env and not in_container():
        env["CGPU_INSTANCE"] = f"run-{os.getpid()}"
    if args.device is not None:
        env["CGPU_DEVICE"] = args.device
    if args.socket is not None:
        env["CGPU_SOCKET"] = args.socket
    if args.on_daemon_loss is not None:
        env["CGPU_ON_DAEMON_LOSS"] = args.on_daemon_loss
    if args.idle_ms is not None:
        env["CGPU_IDLE_MS"] = args.idle_ms
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = BOOT_DIR + (os.pathsep + old if old else "")
    return env


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.print_usage(sys.stderr)
        print("cgpu-run: error: no command given (cgpu-run [OPTIONS] -- CMD ...)", file=sys.stderr)
        return 2
    if args.native:
        print("cgpu-run: --native: libcgpu.so is not implemented yet", file=sys.stderr)
        return 2
    try:
        env = build_env(args, dict(os.environ))
        parse_env(env)
    except EnvError as exc:
        print(f"cgpu-run: {exc}", file=sys.stderr)
        return 2
    if not Path(cmd[0]).name.startswith("python"):
        print(f"cgpu-run: note: {cmd[0]} is not a Python program; only Python/PyTorch work is gated "
              "in this version (the native libcgpu.so is not implemented yet)", file=sys.stderr)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"cgpu-run: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0


if __name__ == "__main__":
    sys.exit(main())

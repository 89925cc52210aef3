"""``cgpu-run``: run a program under the cgpu interposer with the given settings.

    cgpu-run [--gpus LIST] [--weight N | --core-percent P] [--core-limit P] [--mem SIZE] [--highprio] [--instance ID]
             [--device auto|cuda|cpu] [--socket PATH] [--on-daemon-loss wait|run]
             [--idle-ms MS] [--native | --no-native] -- CMD [ARGS...]

It sets the environment of behaviour §6 and puts a start-up hook on PYTHONPATH, so
that ``cgpu-run -- python train.py`` is arbitrated with no code change. Wherever
the program may use CUDA (every program, Python or not, unless ``--device cpu``),
it preloads libcgpu.so (``LD_PRELOAD``), which gates the CUDA driver API itself:
kernels, graph replays and memory of every framework. The Python interposer then
leaves CUDA to it; it gates only the CPU as a simulated GPU (``--device cpu``).
One gate per process: the shim for CUDA, or the Python interposer for the CPU.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import sys
from pathlib import Path

from libcgpu_client.boot import BOOT_DIR
from libcgpu_client.env import GIB, ClientEnv, EnvError, parse_env, parse_size_list
from libcgpu_client.native import shim_path

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
    p.add_argument("--gpus", metavar="LIST", help="the instance's GPUs: indices 0,1 as NVML numbers them, or UUIDs "
                   "(default 0); CUDA_VISIBLE_DEVICES is set to the same list (with CUDA_DEVICE_ORDER=PCI_BUS_ID for "
                   "indices), so that CUDA shows the program those GPUs, in that order")
    share = p.add_mutually_exclusive_group()
    share.add_argument("--weight", type=int, metavar="N", help="scheduling weight 1..max_inst (default 1)")
    share.add_argument("--core-percent", metavar="P", help="a GPU-core percentage instead of a weight: 5..100 in "
                   "steps of 5, weight P/5 of 20 slots on policy 3 (CGPU_CORE_PERCENT)")
    p.add_argument("--core-limit", metavar="P", help="the most GPU time (%%) to be held to, 5..100, even on an "
                   "idle GPU: a ceiling beside the weight's share (CGPU_CORE_LIMIT)")
    p.add_argument("--mem", metavar="SIZE", help="memory limit per GPU: 3 (GiB), 600MiB, or 1GiB,2GiB")
    p.add_argument("--highprio", action="store_true", help="run as a high-priority instance")
    p.add_argument("--instance", metavar="ID", help="instance id to declare (processes outside containers; "
                   "default uid-<uid>, the instance of every host process of that uid)")
    p.add_argument("--device", choices=["auto", "cuda", "cpu"],
                   help="cpu: the CPU acts as the simulated GPU, its operators are gated, and OpenMP waits "
                        "passively (OMP_WAIT_POLICY=PASSIVE unless set) (default auto)")
    p.add_argument("--socket", metavar="PATH", help="arbiter.sock (default /run/cgpu/arbiter.sock)")
    p.add_argument("--on-daemon-loss", choices=["wait", "run"],
                   help="while arbiterd is unreachable: wait (default) or run unchecked")
    p.add_argument("--idle-ms", metavar="MS", help="give an unused lease back after MS (default 3)")
    native = p.add_mutually_exclusive_group()
    native.add_argument("--native", dest="native", action="store_true", default=None,
                        help="preload libcgpu.so, which gates the CUDA driver API (the default, Python programs "
                             "included, unless --device cpu)")
    native.add_argument("--no-native", dest="native", action="store_false",
                        help="do not preload libcgpu.so: only the Python interposer acts, and it gates PyTorch "
                             "operators only (told in one line where a CUDA driver is present)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="the program and its arguments")
    return p


# the variable each flag sets, so that a bad flag value is reported under the flag's name
FLAG_OF = {"ALIYUN_COM_GPU_VISIBLE_DEVICES": ("gpus", "--gpus"), "ALIYUN_COM_GPU_SCHD_WEIGHT": ("weight", "--weight"),
           "ALIYUN_COM_GPU_MEM_CONTAINER": ("mem", "--mem"), "CGPU_MEM_LIMIT": ("mem", "--mem"),
           "CGPU_INSTANCE": ("instance", "--instance"),
           "CGPU_CORE_PERCENT": ("core_percent", "--core-percent"), "CGPU_IDLE_MS": ("idle_ms", "--idle-ms"),
           "CGPU_CORE_LIMIT": ("core_limit", "--core-limit"),
           "CGPU_SOCKET": ("socket", "--socket")}


def flag_error(args: argparse.Namespace, exc: EnvError) -> str:
    """``exc`` in the words of the flag that set the variable, if a flag did."""
    if exc.name.startswith("--"):
        return f"{exc.name} {exc.value}: expected {exc.expected}"
    dest, flag = FLAG_OF.get(exc.name, ("", ""))
    if dest and getattr(args, dest, None) is not None:
        return f"{flag} {getattr(args, dest)}: expected {exc.expected} (sets {exc.name})"
    return str(exc)


def build_env(args: argparse.Namespace, base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    if args.gpus is not None:
        env["ALIYUN_COM_GPU_VISIBLE_DEVICES"] = args.gpus
        visible = [g.strip() for g in args.gpus.split(",")]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        if any(g.isdigit() for g in visible):  # NVML's numbering (the daemon's) is the PCI bus order
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if args.weight is not None:  # a flag wins over what the environment already says
        env["ALIYUN_COM_GPU_SCHD_WEIGHT"] = str(args.weight)
        env.pop("CGPU_CORE_PERCENT", None)
    if args.core_percent is not None:
        env["CGPU_CORE_PERCENT"] = args.core_percent
        env.pop("ALIYUN_COM_GPU_SCHD_WEIGHT", None)
    if args.core_limit is not None:
        env["CGPU_CORE_LIMIT"] = args.core_limit
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
    elif "CGPU_INSTANCE" not in env and not in_container():  # a host process is its uid's: see arbiterd's identity
        env["CGPU_INSTANCE"] = f"uid-{os.geteuid()}"
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


def cpu_sharing_defaults(env: dict[str, str], parsed: ClientEnv) -> None:
    """With the CPU as the simulated GPU, OpenMP workers wait passively unless ``env`` says otherwise.

    The CPU is then time-sliced between containers, and an OpenMP runtime that spin-waits
    (libgomp's default, for a while after each parallel region) burns the next holder's slice
    from a process that has just given the lease back.
    """
    if parsed.device == "cpu" and not parsed.disabled:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")


# what the Python interposer leaves ungated on a GPU, said when a program asks for it alone there
PYTHON_ONLY = ("cgpu-run: --no-native: only the Python interposer acts, and it gates PyTorch operators alone: "
               "CUDA graph replays, Triton, AOTInductor and extension kernels, and other frameworks' CUDA work "
               "(JAX, TensorFlow, CuPy, C/C++) run ungated and uncounted")


def cuda_driver_present() -> bool:
    """The CUDA driver (libcuda.so.1) loads here: a program may use CUDA."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def add_native(env: dict[str, str], shim: Path) -> None:
    """Preload libcgpu.so ahead of anything already preloaded, and tell the Python side."""
    old = env.get("LD_PRELOAD", "").strip()
    env["LD_PRELOAD"] = str(shim) + (" " + old if old else "")
    env["CGPU_NATIVE"] = "1"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.print_usage(sys.stderr)
        print("cgpu-run: error: no command given (cgpu-run [OPTIONS] -- CMD ...)", file=sys.stderr)
        return 2
    try:
        env = build_env(args, dict(os.environ))
        parsed = parse_env(env)
        cpu_sharing_defaults(env, parsed)
    except EnvError as exc:
        print(f"cgpu-run: {flag_error(args, exc)}", file=sys.stderr)
        return 2
    cpu = parsed.device == "cpu"  # the CPU stand-in: the Python interposer's to gate
    native = args.native if args.native is not None else not cpu
    shim = shim_path() if native else None
    if native and shim is None:
        if args.native is None and not cuda_driver_present():
            native = False  # no CUDA on this host to gate, and nothing preloaded to gate it with
        else:
            print("cgpu-run: libcgpu.so is not built in this installation (pip install builds it; "
                  "gcc is needed); use --no-native to run with the Python interposer only", file=sys.stderr)
            return 2
    if shim is not None:
        add_native(env, shim)
    elif args.native is False and not cpu and cuda_driver_present():
        print(PYTHON_ONLY, file=sys.stderr)
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        print(f"cgpu-run: cannot run {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0


if __name__ == "__main__":
    sys.exit(main())

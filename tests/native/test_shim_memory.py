"""Every way a process takes GPU memory is counted against its instance (issue 49, item 2), on the fake driver.

Each scenario runs ``progs/mem_families.c`` under libcgpu.so: after every action it prints what the fake device
holds for the process (``held``, from the fake's own books: contexts, allocations, what pools reserve) and what the
instance's ledger holds (``ledger``: cuMemGetInfo's total less free, which the shim answers from the ledger). The
ledger must equal the device's bytes after every action, an action past the limit must fail with
CUDA_ERROR_OUT_OF_MEMORY (2) and change neither, and the daemon's own ledger (``meminfo``) must hold the same
bytes for the process, and nothing once it is killed with SIGKILL."""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from libcgpu_client.native import build as nb
from tests.native.conftest import PROGS, Native, fields

MIB = 1 << 20
GIB = 1 << 30
OOM = "2"
DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


@pytest.fixture(scope="module")
def families(native: Native, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mem-families") / "mem_families"
    return nb.build_program([PROGS / "mem_families.c"], out, asan=native.asan, link_cuda=native.fakes)


def run(native: Native, d: DaemonProc | None, prog: Path, *actions: str, **env: str) -> list[dict[str, str]]:
    res = subprocess.run([str(prog), *actions], env=native.env(d, **env), capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    return [fields(ln) for ln in res.stdout.splitlines()]


def exact(steps: list[dict[str, str]]) -> None:
    """The ledger holds what the device holds, after every step."""
    for s in steps:
        assert s["ledger"] == s["held"], steps


def oom_changed_nothing(steps: list[dict[str, str]], k: int) -> None:
    assert steps[k]["rc"] == OOM, steps[k]
    assert (steps[k]["held"], steps[k]["ledger"]) == (steps[k - 1]["held"], steps[k - 1]["ledger"]), steps[k - 1:k + 1]


def meminfo(d: DaemonProc, inst: str) -> str:
    return d.ctl("cat", f"0/{inst}/meminfo").stdout


def test_a_pool_counts_what_it_holds_from_the_device_not_what_is_allocated(native: Native, daemon_factory: type,
                                                                           families: Path) -> None:
    """A pool with a 1 GiB release threshold: 300 MiB + 1 byte reserves 302 MiB (the fake's 2 MiB granule), freed
    into the pool and synchronised it stays held and charged; allocating again reuses it; 800 MiB more from the
    default pool is past the 1 GiB limit; cuMemPoolTrimTo gives the bytes back, and destroying the pool the rest."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "threshold=1G", "pool=314572801", "freeasync", "sync", "pool=300M",
                "async=800M", "freeasync", "sync", "trim=100M", "trim=0", "pool=50M", "destroy", "freeasync",
                "sync", CGPU_INSTANCE="pools", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    by = [(s["name"], s["rc"], int(s["ledger"]) // MIB) for s in steps]
    assert by == [("ctx", "0", 0), ("threshold", "0", 0), ("pool", "0", 302), ("freeasync", "0", 302),
                  ("sync", "0", 302), ("pool", "0", 302), ("async", OOM, 302), ("freeasync", "0", 302),
                  ("sync", "0", 302), ("trim", "0", 100), ("trim", "0", 0), ("pool", "0", 50),
                  ("destroy", "0", 50), ("freeasync", "0", 0), ("sync", "0", 0)], by
    oom_changed_nothing(steps, 6)


def test_the_default_pool_gives_back_at_a_synchronisation_not_at_the_free(native: Native, daemon_factory: type,
                                                                          families: Path) -> None:
    """cuMemAllocAsync takes from the device's default pool (release threshold 0): cuMemFreeAsync leaves the bytes in
    the pool, and charged, until the next synchronisation (stream, then context) releases them; with a threshold
    the pool keeps that much across synchronisations, also when an allocation of it is freed with cuMemFree."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "async=600M", "async=600M", "freeasync", "async=500M", "freeasync", "ctxsync",
                "default=256M", "async=300M", "freeasync", "sync", "async=100M", "poolfree", "ctxsync",
                CGPU_INSTANCE="dflt", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    by = [(s["name"], s["rc"], int(s["ledger"]) // MIB) for s in steps]
    assert by == [("ctx", "0", 0), ("async", "0", 600), ("async", OOM, 600), ("freeasync", "0", 600),
                  ("async", "0", 600), ("freeasync", "0", 600), ("ctxsync", "0", 0), ("default", "0", 0),
                  ("async", "0", 300), ("freeasync", "0", 300), ("sync", "0", 256), ("async", "0", 256),
                  ("poolfree", "0", 256), ("ctxsync", "0", 256)], by
    oom_changed_nothing(steps, 2)


def test_managed_memory_is_counted_whole(native: Native, daemon_factory: type, families: Path) -> None:
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "managed=600M", "managed=600M", "managed=400M", "freeall",
                CGPU_INSTANCE="managed", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert [(s["rc"], int(s["ledger"]) // MIB) for s in steps[1:]] == [("0", 600), (OOM, 600), ("0", 1000), ("0", 0)]
    oom_changed_nothing(steps, 2)


def test_arrays_and_mipmapped_arrays_are_counted_from_their_descriptors(native: Native, daemon_factory: type,
                                                                        families: Path) -> None:
    """4 x float32 elements (16 bytes): a 4096 x 4096 array is 256 MiB; a 512 x 512 x 256 one (1 GiB) is past the
    limit; a 13-level mipmapped 4096 x 4096 array is 256 MiB times the sum of 4^-l (341.33 MiB); then 512 MiB more
    is past it; destroying them gives everything back."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "array=4096,4096", "array3d=512,512,256", "mipmap=4096,4096,13",
                "array3d=512,512,128", "array3d=64,64,64", "freeall", CGPU_INSTANCE="arrays", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    mip = sum(16 * max(4096 >> k, 1) ** 2 for k in range(13))
    used = [int(s["ledger"]) for s in steps[1:]]
    assert used == [256 * MIB, 256 * MIB, 256 * MIB + mip, 256 * MIB + mip, 260 * MIB + mip, 0], used
    assert [s["rc"] for s in steps[1:]] == ["0", OOM, "0", OOM, "0", "0"]
    oom_changed_nothing(steps, 2)
    oom_changed_nothing(steps, 4)


def test_vmm_counts_device_located_handles_and_not_host_located_ones(native: Native, daemon_factory: type,
                                                                     families: Path) -> None:
    """cuMemCreate in host memory (CU_MEM_LOCATION_TYPE_HOST, HOST_NUMA, HOST_NUMA_CURRENT: NCCL's and NVSHMEM's
    buffers) takes nothing from the GPU and is not charged, even past the GPU limit; device-located handles are."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "vmm=2G,host", "vmm=600M,device", "vmm=2G,numa", "vmm=2G,numacur",
                "vmm=600M,device", "freeall", CGPU_INSTANCE="vmm", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert [(s["rc"], int(s["ledger"]) // MIB) for s in steps[1:]] == [("0", 0), ("0", 600), ("0", 600), ("0", 600),
                                                                      (OOM, 600), ("0", 0)]
    oom_changed_nothing(steps, 5)


def test_each_process_context_is_measured_and_counted(native: Native, daemon_factory: type, families: Path) -> None:
    """Contexts of 400 MiB (FAKECUDA_CTX_MB), a 1 GiB instance: the first process's context is on the ledger, so 700
    MiB is past the limit; a second process's context fits beside it and goes with it; with two processes holding
    theirs, a third's context creation fails with CUDA_ERROR_OUT_OF_MEMORY and the ledger is unchanged."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "ctx", "CGPU_MEM_LIMIT": "1GiB", "FAKECUDA_CTX_MB": "400"}
    holders = []
    try:
        first = hold(native, d, families, env, "alloc=700M")
        holders.append(first)
        head = first.steps
        exact(head)
        assert [(s["name"], s["rc"], int(s["ledger"]) // MIB) for s in head] == [
            ("ctx", "0", 400), ("alloc", OOM, 400), ("ready", "0", 400)], head
        second = run(native, d, families, "alloc=100M", **env)
        assert [(s["rc"], int(s["held"]) // MIB, int(s["ledger"]) // MIB) for s in second] == [
            ("0", 400, 800), ("0", 500, 900)], second  # the ledger is the instance's: both contexts
        holders.append(hold(native, d, families, env))
        assert f"Free: {GIB - 800 * MIB}" in meminfo(d, "ctx")
        third = subprocess.run([str(families), "alloc=1M"], env=native.env(d, **env), capture_output=True,
                               text=True, timeout=60)
        assert third.returncode == 0 and third.stdout.splitlines() == ["ctx rc=2"], (third.stdout, third.stderr)
        info = meminfo(d, "ctx")
        assert f"PID: {first.proc.pid} Mem: {400 * MIB}" in info and f"Free: {GIB - 800 * MIB}" in info, info
    finally:
        for h in holders:
            h.proc.kill()
            h.proc.wait()


def test_contexts_of_cuctxcreate_are_counted_until_destroyed(native: Native, daemon_factory: type,
                                                             families: Path) -> None:
    """Each context cuCtxCreate makes takes its own memory (300 MiB here): the third one past a 1 GiB limit fails
    with CUDA_ERROR_OUT_OF_MEMORY and nothing changed; cuCtxDestroy gives each back."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "newctx", "newctx", "newctx", "dropctx", "dropctx", CGPU_INSTANCE="ctxs",
                CGPU_MEM_LIMIT="1GiB", FAKECUDA_CTX_MB="300")
    exact(steps)
    assert [(s["rc"], int(s["ledger"]) // MIB) for s in steps] == [("0", 300), ("0", 600), ("0", 900), (OOM, 900),
                                                                   ("0", 600), ("0", 300)], steps
    oom_changed_nothing(steps, 3)


@dataclass
class Holder:
    proc: subprocess.Popen[str]
    steps: list[dict[str, str]]


def hold(native: Native, d: DaemonProc, prog: Path, env: dict[str, str], *actions: str) -> Holder:
    """``prog`` doing ``actions`` and then holding what it took; its lines up to "ready"."""
    proc = subprocess.Popen([str(prog), *actions, "ready", "sleep=30000"], env=native.env(d, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    steps: list[dict[str, str]] = []
    while not steps or steps[-1]["name"] != "ready":
        line = proc.stdout.readline()
        if not line:
            proc.kill()
            _, err = proc.communicate()
            raise AssertionError(f"{steps} {err}")
        steps.append(fields(line))
    return Holder(proc, steps)


def test_a_jax_style_preallocation_of_75_percent_stays_inside_the_limit(native: Native, daemon_factory: type,
                                                                        families: Path) -> None:
    """XLA's cuda_async allocator: 75 % of the total cuMemGetInfo shows, from the default pool with its release
    threshold at the maximum, allocated, freed and synchronised (the pool keeps it). Under a 4 GiB limit with a 300
    MiB context it takes 3 GiB of the 4 shown, the ledger holds context and pool exactly, and the limit holds: 800
    MiB more fails. With the shim disabled the same program takes 75 % of the 16 GiB card."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "jax", "CGPU_MEM_LIMIT": "4GiB", "FAKECUDA_CTX_MB": "300"}
    steps = run(native, d, families, "jax=0.75", "alloc=800M", "alloc=700M", **env)
    exact(steps)
    jax = steps[1]
    assert (jax["rc"], jax["total"], jax["bytes"]) == ("0", str(4 * GIB), str(3 * GIB)), jax
    assert int(jax["ledger"]) == 3 * GIB + 300 * MIB <= 4 * GIB
    assert [s["rc"] for s in steps[2:]] == [OOM, "0"]
    bare = run(native, None, families, "jax=0.75", CGPU_DISABLE="1", FAKECUDA_CTX_MB="300")
    assert bare[1]["total"] == str(16 * GIB) and bare[1]["bytes"] == str(12 * GIB), bare


def test_the_ledger_is_exact_after_kill_9_whatever_the_process_held(native: Native, daemon_factory: type,
                                                                    families: Path) -> None:
    """One process holds memory every way at once (its context, a pool keeping freed bytes, managed memory, an
    array, a mipmapped array, a device-located VMM handle, a host-located one): the daemon's ledger holds exactly
    what the device holds for it, and once it is killed with SIGKILL, nothing."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "all", "CGPU_MEM_LIMIT": "2GiB", "FAKECUDA_CTX_MB": "300"}
    held_by = hold(native, d, families, env, "threshold=1G", "pool=200M", "freeasync", "sync", "managed=100M",
                   "array=1024,1024", "mipmap=1024,1024,11", "vmm=100M,device", "vmm=1G,host", "async=10M")
    try:
        exact(held_by.steps)
        held = int(held_by.steps[-1]["held"])
        assert held > 300 * MIB + 200 * MIB + 100 * MIB + 16 * MIB + 100 * MIB
        assert f"PID: {held_by.proc.pid} Mem: {held}" in meminfo(d, "all")
    finally:
        held_by.proc.send_signal(signal.SIGKILL)
        held_by.proc.wait()
    deadline = time.monotonic() + 2.0
    info = meminfo(d, "all")
    while time.monotonic() < deadline and "PID:" in info:
        time.sleep(0.05)
        info = meminfo(d, "all")
    assert f"Free: {2 * GIB}" in info and "PID:" not in info, info

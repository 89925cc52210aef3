"""The shim, the fake driver and the test programs built with AddressSanitizer and UBSan.

Any report makes the process exit non-zero (ASan 86, UBSan 87) and prints
``ERROR: AddressSanitizer`` or ``runtime error``; each scenario asserts neither
happened. Leak checking is on.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.native.conftest import WORKLOADS, Native, at, lines, run_job, start_job

DAEMON = ("--sim-gpus", "1x16GiB", "--identity", "declared", "--trust-client-env")


def clean(res: subprocess.CompletedProcess[str] | tuple[int, str]) -> None:
    code, err = (res.returncode, res.stderr) if isinstance(res, subprocess.CompletedProcess) else res
    assert "AddressSanitizer" not in err and "runtime error" not in err and "LeakSanitizer" not in err, err
    assert code == 0, err


def test_codec_under_asan(native_asan: Native) -> None:
    import msgpack

    from tests.native.test_codec import every_message, roundtrip

    data = b"".join(msgpack.packb(m) for m in every_message() if len(msgpack.packb(m)) <= 65536)
    res = roundtrip(native_asan, data)
    assert res.returncode == 0, res.stderr
    bad = roundtrip(native_asan, data[: len(data) // 3])  # ends inside a message
    assert b"AddressSanitizer" not in bad.stderr and bad.returncode == 1


def test_two_processes_memory_and_resolution_under_asan(native_asan: Native, daemon_factory: type,
                                                        short_tmp: Path) -> None:
    d = daemon_factory.start(*DAEMON, "--policy", "2", "--slice-ms", "10")
    start, end = at(0.5), at(2.5)
    procs = [start_job(native_asan, d, *opts, f"spin=2,3,{start},{end}", dl=dl, CGPU_INSTANCE=name,
                       ALIYUN_COM_GPU_SCHD_WEIGHT=w)
             for name, w, dl, opts in (("a", "1", False, []), ("b", "2", True, ["--resolve", "gpa"]))]
    mem = run_job(native_asan, d, "alloc=600M", "pitch=1000,100", "async=10M", "create=10M", "alloc=600M",
                  "info", "total", "freeall", CGPU_INSTANCE="m", CGPU_MEM_LIMIT="1GiB")
    clean(mem)
    assert [ln["rc"] for ln in lines(mem.stdout, "alloc")] == ["0", "2"]
    for p in procs:
        _, err = p.communicate(timeout=60)
        clean((p.returncode, err))
    graph = run_job(native_asan, d, "--api", "graph", f"spin=1,4,0,{at(0.3)}", dl=True, CGPU_INSTANCE="g")
    clean(graph)


def test_daemon_loss_and_reconnect_under_asan(native_asan: Native, daemon_factory: type) -> None:
    d = daemon_factory.start(*DAEMON)
    job = start_job(native_asan, d, "alloc=10M", f"spin=1,2,0,{at(3)}", "freeall", CGPU_INSTANCE="r")
    time.sleep(1)
    d.stop(signal.SIGKILL)
    time.sleep(0.5)
    d.start()
    _, err = job.communicate(timeout=60)
    clean((job.returncode, err))
    assert "reconnected" in err


def test_ctypes_python_under_asan_shim(native_asan: Native, daemon_factory: type) -> None:
    """A Python program (not built with ASan) under the ASan-built shim and fakes."""
    d = daemon_factory.start(*DAEMON)
    env = native_asan.env(d, CGPU_INSTANCE="py", CGPU_MEM_LIMIT="1GiB")
    env["ASAN_OPTIONS"] = "detect_leaks=0:exitcode=86"  # CPython itself is not leak-clean at exit
    res = subprocess.run([sys.executable, str(WORKLOADS / "ctypes_cuda.py"), "gpa", "2", "10", str(2 << 30)],
                         env=env, capture_output=True, text=True, timeout=120)
    clean(res)
    assert "alloc_rc=2" in res.stdout


def test_env_parsing_under_asan(native_asan: Native) -> None:
    """Every environment case of the C/Python agreement test, through the ASan build of the parser."""
    from tests.native.test_codec import ENV_CASES, describe

    for env in ENV_CASES:
        res = subprocess.run([str(native_asan.codec), "env"], env=env, capture_output=True, text=True, timeout=10)
        clean(res)
        assert res.stdout.strip() == describe(env)


def test_every_memory_family_under_asan(native_asan: Native, daemon_factory: type, tmp_path: Path) -> None:
    """progs/mem_families.c, ASan-built, under the ASan-built shim and fakes: pools (created, default, trimmed,
    destroyed with an allocation outstanding), managed memory, arrays, mipmapped arrays, VMM in device and host
    memory, a measured context, a JAX-style preallocation, and allocations past the limit of each."""
    from libcgpu_client.native import build as nb
    from tests.native.conftest import PROGS, fields

    prog = nb.build_program([PROGS / "mem_families.c"], tmp_path / "mem_families", asan=True,
                            link_cuda=native_asan.fakes)
    d = daemon_factory.start(*DAEMON)
    res = subprocess.run([str(prog), "threshold=256M", "pool=100M", "async=100M", "freeasync", "sync", "trim=0",
                          "pool=10M", "destroy", "async=2G", "managed=100M", "managed=2G", "array=1024,1024",
                          "array3d=64,64,64", "mipmap=1024,1024,11", "array3d=1024,1024,1024", "vmm=100M,device",
                          "vmm=2G,host", "vmm=2G,device", "freeall", "freeasync", "jax=0.75", "ctxsync"],
                         env=native_asan.env(d, CGPU_INSTANCE="fam", CGPU_MEM_LIMIT="1GiB", FAKECUDA_CTX_MB="100"),
                         capture_output=True, text=True, timeout=120)
    clean(res)
    steps = [fields(ln) for ln in res.stdout.splitlines()]
    assert all(s["ledger"] == s["held"] for s in steps), steps
    assert [s["name"] for s in steps if s["rc"] == "2"] == ["async", "managed", "array3d", "vmm"], steps


def test_graph_memory_and_imported_pools_under_asan(native_asan: Native, daemon_factory: type, tmp_path: Path) -> None:
    """progs/mem_families.c, ASan-built, under the ASan-built shim and fakes: graphs with captured and explicit
    allocation nodes uploaded, launched past the limit, left live, freed, destroyed and trimmed; a graph with memory
    nodes refused a second instantiation, as a clone and as a child, reinstantiated, a graph without them cloned and
    embedded beside an allocation node; executable graphs updated (refused with a graph instantiated elsewhere and
    with another topology, made larger through both entry points, the second past the limit at its launch); a pool
    exported and imported back into the same process, allocated from (refused) and freed."""
    from libcgpu_client.native import build as nb
    from tests.native.conftest import PROGS, fields

    prog = nb.build_program([PROGS / "mem_families.c"], tmp_path / "mem_families", asan=True,
                            link_cuda=native_asan.fakes)
    d = daemon_factory.start(*DAEMON)
    res = subprocess.run([str(prog), "capture=300M,free", "upload", "launch", "capture=800M", "launch", "gdestroy",
                          "capture=200M,auto", "launch", "launch", "gfree", "sync", "node=100M", "launch", "gfree",
                          "sync", "gtrim", "gdestroy", "gdestroy", "gdestroy", "gtrim", "capture=100M,free",
                          "capture=50M,free", "launch", "update=prev", "update=80M", "update=150M,free", "launch",
                          "update=1000M,free,v1", "launch", "sync", "gdestroy", "gdestroy", "gtrim", "node=50M",
                          "again", "reinst", "clone", "child", "empty", "clone", "child=50M", "launch", "gfree", "sync",
                          "gdestroy", "gdestroy", "gdestroy", "gdestroy", "gtrim", "export=100M", "import=self",
                          "importalloc=10M", "importfree", "freeasync", "ctxsync"],
                         env=native_asan.env(d, CGPU_INSTANCE="gfam", CGPU_MEM_LIMIT="1GiB", FAKECUDA_CTX_MB="100"),
                         capture_output=True, text=True, timeout=120)
    clean(res)
    steps = [fields(ln) for ln in res.stdout.splitlines()]
    assert all(s["ledger"] == s["held"] for s in steps), steps
    assert [(s["name"], s["rc"]) for s in steps if s["rc"] != "0"] == [
        ("launch", "2"), ("update", "910"), ("update", "910"), ("launch", "2"), ("again", "1"), ("clone", "1"),
        ("child", "1"), ("importalloc", "1")], steps

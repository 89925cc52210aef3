"""Graph memory nodes and imported pools against the instance's ledger (issue 49, item 2), on the fake driver.

As ``test_shim_memory.py``: ``progs/mem_families.c`` under libcgpu.so prints after every action what the fake device
holds for the process (``held``), what the instance's ledger holds (``ledger``) and, for graph actions, what the
device's graph memory pool reserves (``greserved``). The ledger must equal the device's bytes after every action; an
upload or launch that would take the graph memory pool past the limit fails with CUDA_ERROR_OUT_OF_MEMORY (2) and
changes nothing; the daemon's own ledger holds the same bytes, and nothing once the process is killed with SIGKILL.

Imported pools are tested with two processes: the exporter holds a pool exported as a POSIX file descriptor and one
allocation from it; the importer (in the same instance) opens the descriptor through /proc/PID/fd/N, imports the
pool and the allocation, and frees it."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from cgpu_testing.daemon import DaemonProc
from libcgpu_client.native import build as nb
from tests.native.conftest import PROGS, Native
from tests.native.test_shim_memory import DAEMON, MIB, OOM, exact, hold, meminfo, oom_changed_nothing, run

INVALID = "1"


@pytest.fixture(scope="module")
def families(native: Native, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("graph-mem") / "mem_families"
    return nb.build_program([PROGS / "mem_families.c"], out, asan=native.asan, link_cuda=native.fakes)


def failed_changing_nothing(steps: list[dict[str, str]], k: int, rc: str) -> None:
    assert steps[k]["rc"] == rc, steps[k]
    assert (steps[k]["held"], steps[k]["ledger"]) == (steps[k - 1]["held"], steps[k - 1]["ledger"]), steps[k - 1:k + 1]


def by(steps: list[dict[str, str]]) -> list[tuple[str, str, int, int]]:
    """(action, rc, ledger MiB, graph pool MiB) of each step after the context's."""
    return [(s["name"], s["rc"], int(s["ledger"]) // MIB, int(s.get("greserved", "-1048576")) // MIB)
            for s in steps[1:]]


def test_a_graph_memory_pool_is_charged_when_it_maps_not_when_captured(native: Native, daemon_factory: type,
                                                                        families: Path) -> None:
    """A captured cuMemAllocAsync of 300 MiB (and its free) takes nothing until the graph is uploaded; then the pool
    reserves 300 MiB and the ledger holds it, across launches. A second graph of 800 MiB is past the 1 GiB limit at
    its launch: CUDA_ERROR_OUT_OF_MEMORY, nothing changed. Destroyed graphs leave their memory in the pool (still
    charged), which serves the next graph's 600 MiB first (300 MiB more); a trim gives it all back, and the next
    launch takes it again."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "capture=300M,free", "upload", "launch", "capture=800M,free", "launch",
                "gdestroy", "gdestroy", "capture=600M,free", "launch", "sync", "gtrim", "launch", "alloc=500M",
                "sync", "gdestroy", "gtrim", CGPU_INSTANCE="graphs", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("capture", "0", 0, 0), ("upload", "0", 300, 300), ("launch", "0", 300, 300),
                         ("capture", "0", 300, 300), ("launch", OOM, 300, 300), ("gdestroy", "0", 300, 300),
                         ("gdestroy", "0", 300, 300), ("capture", "0", 300, 300), ("launch", "0", 600, 600),
                         ("sync", "0", 600, -1), ("gtrim", "0", 0, 0), ("launch", "0", 600, 600),
                         ("alloc", OOM, 600, -1), ("sync", "0", 600, -1), ("gdestroy", "0", 600, 600),
                         ("gtrim", "0", 0, 0)], by(steps)
    oom_changed_nothing(steps, 5)
    oom_changed_nothing(steps, 13)


def test_graph_allocations_left_live_and_explicit_alloc_nodes(native: Native, daemon_factory: type,
                                                            families: Path) -> None:
    """A captured allocation without a free node stays live after the launch: relaunching before it is freed fails
    with CUDA_ERROR_INVALID_VALUE (cuGraphLaunch) and changes nothing; freed with cuMemFreeAsync, the graph runs
    again without growing the pool. A graph built with cuGraphAddMemAllocNode (700 MiB) is past the limit at its
    upload, and fits once the first graph is destroyed and its pool memory serves it."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "capture=200M", "launch", "launch", "gfree", "launch", "gfree", "sync",
                "node=900M", "upload", "gdestroy", "gdestroy", "node=700M", "upload", "launch", "gfree", "sync",
                "gdestroy", "gtrim", CGPU_INSTANCE="live", CGPU_MEM_LIMIT="1GiB", FAKECUDA_CTX_MB="100")
    exact(steps)
    assert by(steps) == [("capture", "0", 100, 0), ("launch", "0", 300, 200), ("launch", INVALID, 300, 200),
                         ("gfree", "0", 300, 200), ("launch", "0", 300, 200), ("gfree", "0", 300, 200),
                         ("sync", "0", 300, -1), ("node", "0", 300, 200), ("upload", OOM, 300, 200),
                         ("gdestroy", "0", 300, 200), ("gdestroy", "0", 300, 200), ("node", "0", 300, 200),
                         ("upload", "0", 800, 700), ("launch", "0", 800, 700), ("gfree", "0", 800, 700),
                         ("sync", "0", 800, -1), ("gdestroy", "0", 800, 700), ("gtrim", "0", 100, 0)], by(steps)
    failed_changing_nothing(steps, 3, INVALID)
    oom_changed_nothing(steps, 9)


def test_an_instantiation_that_uploads_reserves_at_the_instantiation(native: Native, daemon_factory: type,
                                                                     families: Path) -> None:
    """cuGraphInstantiateWithParams with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD maps at the instantiation: 400 MiB is
    charged there; a second graph of 700 MiB fails there with CUDA_ERROR_OUT_OF_MEMORY (no executable graph made,
    nothing changed), and is made once the first is destroyed and trimmed."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "capture=400M,free,upload", "launch", "capture=700M,free,upload", "sync",
                "gdestroy", "gtrim", "capture=700M,free,upload", CGPU_INSTANCE="upl", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("capture", "0", 400, 400), ("launch", "0", 400, 400), ("capture", OOM, 400, 400),
                         ("sync", "0", 400, -1), ("gdestroy", "0", 400, 400), ("gtrim", "0", 0, 0),
                         ("capture", "0", 700, 700)], by(steps)
    oom_changed_nothing(steps, 3)


def test_the_graph_memory_pool_is_freed_from_the_ledger_after_kill_9(native: Native, daemon_factory: type,
                                                                     families: Path) -> None:
    """A process holding a 400 MiB graph memory pool (its graph destroyed, the memory kept): the daemon's ledger
    holds it for the process, and nothing once the process is killed with SIGKILL."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "gkill", "CGPU_MEM_LIMIT": "1GiB"}
    held_by = hold(native, d, families, env, "capture=400M,free", "launch", "sync", "gdestroy")
    try:
        exact(held_by.steps)
        assert int(held_by.steps[-1]["held"]) == 400 * MIB
        assert f"PID: {held_by.proc.pid} Mem: {400 * MIB}" in meminfo(d, "gkill")
    finally:
        held_by.proc.send_signal(signal.SIGKILL)
        held_by.proc.wait()
    gone(d, "gkill", 1 << 30)


def gone(d: DaemonProc, inst: str, free: int) -> None:
    """The daemon's ledger of ``inst`` holds no process and ``free`` bytes free, within 2 s."""
    deadline = time.monotonic() + 2.0
    info = meminfo(d, inst)
    while time.monotonic() < deadline and "PID:" in info:
        time.sleep(0.05)
        info = meminfo(d, inst)
    assert f"Free: {free}" in info and "PID:" not in info, info


def test_an_imported_pool_is_counted_by_its_exporter_only(native: Native, daemon_factory: type,
                                                          families: Path) -> None:
    """Two processes of one 1 GiB instance. The exporter holds 300 MiB from an exportable pool; the importer imports
    the pool and the allocation (nothing more on the ledger: the instance holds the exporter's 300 MiB), tries to
    allocate 800 MiB from the imported pool (the driver refuses it with CUDA_ERROR_INVALID_VALUE, and the ledger is
    unchanged, not charged the import), and frees the imported allocation (nothing given back: the exporter still
    holds it). The daemon holds 300 MiB for the exporter and nothing for the importer; killed with SIGKILL, the
    exporter's 300 MiB goes."""
    d = daemon_factory.start(*DAEMON)
    env = {"CGPU_INSTANCE": "ipc", "CGPU_MEM_LIMIT": "1GiB"}
    exporter = hold(native, d, families, env, "export=300M")
    try:
        exact(exporter.steps)
        x = exporter.steps[1]
        assert (x["rc"], int(x["held"]) // MIB) == ("0", 300), x
        steps = run(native, d, families, f"import={x['pid']},{x['fd']},{x['data']}", "importalloc=800M",
                    "importfree", "import=" + f"{x['pid']},{x['fd']},{x['data']}", "ready", **env)
        assert [(s["name"], s["rc"], int(s["held"]) // MIB, int(s["ledger"]) // MIB) for s in steps] == [
            ("ctx", "0", 0, 300), ("import", "0", 0, 300), ("importalloc", INVALID, 0, 300),
            ("importfree", "0", 0, 300), ("import", "0", 0, 300), ("ready", "0", 0, 300)], steps
        info = meminfo(d, "ipc")
        assert f"PID: {exporter.proc.pid} Mem: {300 * MIB}" in info and f"Free: {724 * MIB}" in info, info
    finally:
        exporter.proc.send_signal(signal.SIGKILL)
        exporter.proc.wait()
    gone(d, "ipc", 1 << 30)


def test_a_process_importing_its_own_export_counts_it_once(native: Native, daemon_factory: type,
                                                           families: Path) -> None:
    """One process exports a pool's 300 MiB and imports it back: the ledger holds the 300 MiB once, an allocation
    from the imported pool is refused without a charge, freeing the import gives nothing back, and the exportable
    pool keeps its memory across a synchronisation (IPC pools do not release) until it is freed and destroyed."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "export=300M", "import=self", "importalloc=800M", "importfree", "freeasync",
                "sync", CGPU_INSTANCE="self", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert [(s["name"], s["rc"], int(s["ledger"]) // MIB) for s in steps[1:]] == [
        ("export", "0", 300), ("import", "0", 300), ("importalloc", INVALID, 300), ("importfree", "0", 300),
        ("freeasync", "0", 300), ("sync", "0", 300)], steps


def test_graphs_with_memory_nodes_are_neither_cloned_nor_embedded(native: Native, daemon_factory: type,
                                                                  families: Path) -> None:
    """CUDA refuses to clone a graph holding memory nodes or to embed it as a child graph (cuGraphAddMemFreeNode's
    restrictions, cuGraphClone, cuGraphAddChildGraphNode): both fail with CUDA_ERROR_INVALID_VALUE and change
    nothing, so no graph memory escapes the shim's count through them. A graph without memory nodes is cloned and
    embedded; a graph holding such a child and a 900 MiB allocation node of its own is past the 1 GiB limit at its
    upload (CUDA_ERROR_OUT_OF_MEMORY, nothing changed), and with 600 MiB it is charged at its launch."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "node=300M", "clone", "child", "upload", "empty", "clone", "child=900M",
                "upload", "gdestroy", "child=600M", "launch", "sync", "gfree", "sync",
                CGPU_INSTANCE="clone", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("node", "0", 0, 0), ("clone", INVALID, 0, 0), ("child", INVALID, 0, 0),
                         ("upload", "0", 300, 300), ("empty", "0", 300, 300), ("clone", "0", 300, 300),
                         ("child", "0", 300, 300), ("upload", OOM, 300, 300), ("gdestroy", "0", 300, 300),
                         ("child", "0", 300, 300), ("launch", "0", 900, 900), ("sync", "0", 900, -1),
                         ("gfree", "0", 900, 900), ("sync", "0", 900, -1)], by(steps)
    failed_changing_nothing(steps, 2, INVALID)
    failed_changing_nothing(steps, 3, INVALID)
    oom_changed_nothing(steps, 8)


def test_a_graph_with_memory_nodes_has_one_executable_graph_at_a_time(native: Native, daemon_factory: type,
                                                                       families: Path) -> None:
    """CUDA allows one instantiation at a time of a graph holding memory nodes (cuGraphAddMemFreeNode's
    restrictions): a second instantiation fails with CUDA_ERROR_INVALID_VALUE and changes nothing, so the shim never
    counts one graph's allocation nodes for two executable graphs. Once the first is destroyed, a new one is made,
    and its upload is served from what the pool kept (no new charge)."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "node=300M", "upload", "again", "reinst", "again", "upload", "launch", "gfree",
                "sync", CGPU_INSTANCE="once", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("node", "0", 0, 0), ("upload", "0", 300, 300), ("again", INVALID, 300, 300),
                         ("reinst", "0", 300, 300), ("again", INVALID, 300, 300), ("upload", "0", 300, 300),
                         ("launch", "0", 300, 300), ("gfree", "0", 300, 300), ("sync", "0", 300, -1)], by(steps)
    failed_changing_nothing(steps, 3, INVALID)
    failed_changing_nothing(steps, 5, INVALID)


UPDATE_FAILED = "910"  # CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE


def results(steps: list[dict[str, str]]) -> list[int]:
    """The CUgraphExecUpdateResult of each update= step."""
    return [int(s["result"]) for s in steps if s["name"] == "update"]


def test_an_updated_executable_graph_is_charged_its_new_size_before_it_maps(native: Native, daemon_factory: type,
                                                                           families: Path) -> None:
    """cuGraphExecUpdate may give an executable graph larger allocation nodes (CUDA lists no limitation on memory
    nodes but one: the new graph may not be instantiated as another executable graph). A graph of 300 MiB (and its
    free node) is launched, then updated to 500 MiB: nothing maps at the update (ledger and pool stay at 300 MiB),
    the next launch maps 500 MiB and the ledger holds it. Updated to 1100 MiB it is past the 1 GiB limit at its next
    launch and upload: CUDA_ERROR_OUT_OF_MEMORY, nothing changed (the old code let that launch through and charged
    nothing for it). Updated again to 700 MiB, its upload maps 700 MiB, and the ledger follows the pool down after a
    trim."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "capture=300M,free", "launch", "update=500M,free", "launch",
                "update=1100M,free", "launch", "upload", "sync", "update=700M,free", "upload", "launch", "sync",
                "gdestroy", "gtrim", CGPU_INSTANCE="upd", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("capture", "0", 0, 0), ("launch", "0", 300, 300), ("update", "0", 300, 300),
                         ("launch", "0", 500, 500), ("update", "0", 500, 500), ("launch", OOM, 500, 500),
                         ("upload", OOM, 500, 500), ("sync", "0", 500, -1), ("update", "0", 500, 500),
                         ("upload", "0", 700, 700), ("launch", "0", 700, 700), ("sync", "0", 700, -1),
                         ("gdestroy", "0", 700, 700), ("gtrim", "0", 0, 0)], by(steps)
    assert results(steps) == [0, 0, 0], steps
    oom_changed_nothing(steps, 6)
    oom_changed_nothing(steps, 7)


def test_a_refused_update_changes_nothing_and_the_cuda_11_entry_point_is_counted(native: Native,
                                                                                  daemon_factory: type,
                                                                                  families: Path) -> None:
    """Graph A (300 MiB) is uploaded; graph B (200 MiB) is made. Updating B's executable graph with A, which A's
    executable graph instantiates, is refused (CU_GRAPH_EXEC_UPDATE_ERROR, the Programming Guide's "Graph Update
    Limitations" for memory nodes), and with a graph of one node where B has two (an allocation and its free):
    CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED; both fail with CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE and change
    nothing: B's launch maps its 200 MiB. Through CUDA 11's cuGraphExecUpdate B becomes 900 MiB: its launch is past
    the limit (the 200 MiB it maps serve, 700 MiB more do not fit beside A's 300 MiB) and changes nothing; after a
    trim, which unmaps both idle graphs, it maps 900 MiB."""
    d = daemon_factory.start(*DAEMON)
    steps = run(native, d, families, "capture=300M,free", "upload", "capture=200M,free", "update=prev",
                "update=900M", "launch", "sync", "update=900M,free,v1", "launch", "gtrim", "launch", "sync",
                CGPU_INSTANCE="refuse", CGPU_MEM_LIMIT="1GiB")
    exact(steps)
    assert by(steps) == [("capture", "0", 0, 0), ("upload", "0", 300, 300), ("capture", "0", 300, 300),
                         ("update", UPDATE_FAILED, 300, 300), ("update", UPDATE_FAILED, 300, 300),
                         ("launch", "0", 500, 500), ("sync", "0", 500, -1), ("update", "0", 500, 500),
                         ("launch", OOM, 500, 500), ("gtrim", "0", 0, 0), ("launch", "0", 900, 900),
                         ("sync", "0", 900, -1)], by(steps)
    assert results(steps) == [1, 2, 0], steps
    failed_changing_nothing(steps, 4, UPDATE_FAILED)
    failed_changing_nothing(steps, 5, UPDATE_FAILED)
    oom_changed_nothing(steps, 9)

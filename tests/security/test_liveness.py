"""Identity from a live process: a zombie never passes for the host, on either socket.

On cgroup v1 (and hybrid hosts, as these tests run here) the kernel shows an exiting task's ``/proc/PID/cgroup`` as
``/``, and a pidfd still answers for a zombie. A container child that connects and exits unreaped would so pass for
a host process of its uid (root, for a container's root) while its parent speaks on the connection. arbiterd reads
the peer once, at accept, and only while it is live (not Z or X, not exiting): arbiterd/server/identity.py,
arbiterd/server/adminconn.py. Before: the zombie registered past ``allocations = required`` as uid-0, and on
admin.sock container root created ``weight=8 highprio=1``.
"""

from __future__ import annotations

import time

from tests.security.conftest import Cast, needs_root


@needs_root
def test_a_zombie_that_connected_to_arbiter_sock_is_refused_not_taken_for_the_host(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--allocations", "required")
    attacker = cast.agent(d, cid=cast.containers.new_id())
    with d.stopped():  # type: ignore[attr-defined]
        child = attacker.call("zombie_connect")["child"]  # connected, exited, unreaped: accepted as a zombie
    assert child != attacker.pid
    first = attacker.call("recv")
    assert first.get("op") == "error" and first["code"] == "identity", first
    assert "zombie" in first["message"] and f"pid {child}" in first["message"], first
    assert attacker.call("recv").get("closed")
    assert d.status()["clients"] == 0


@needs_root
def test_a_zombie_on_admin_sock_is_refused_whether_it_died_before_or_after_the_accept(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB")
    attacker = cast.agent(d, cid=cast.containers.new_id())
    create = {"sock": d.admin, "path": "/v1/tree/inst_ctl", "method": "PUT",  # type: ignore[attr-defined]
              "body": "create stolen weight=8 highprio=1"}
    after = attacker.call("admin_get", zombie=0.3, **create)  # accepted while the child lived: told then, not re-read
    assert after["status"] == 403 and "is in container" in after["body"], after
    with d.stopped():  # type: ignore[attr-defined]
        attacker.begin("admin_get", zombie=0.0, **create)
        time.sleep(0.5)  # the child connects and exits while the daemon is stopped: accepted as a zombie
    before = attacker.result()
    assert before["status"] == 403 and "zombie" in before["body"], before
    assert "stolen" not in d.ctl("cat", "inst_ctl").stdout  # type: ignore[attr-defined]
    host = cast.agent(d)
    assert host.call("admin_get", sock=d.admin, path="/v1/status")["status"] == 200  # type: ignore[attr-defined]

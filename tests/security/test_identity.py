"""An identity cannot be borrowed, shed or squatted: real processes, a host attacker running as nobody, containers
in real cgroups (or a fake /proc where the tests do not run as root)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cgpu_testing.cast import forge_container
from cgpu_testing.containers import give_cgroup, remove_cgroups
from tests.security.conftest import NOBODY, Cast, needs_root

GIB = 1024**3


def open_daemon(cast: Cast, *args: str) -> object:
    """By hand, with the socket opened to every user, so host attacks reach the daemon at all."""
    return cast.daemon("--sim-gpus", "2x4GiB", "--client-mode", "0666", *args)


@needs_root
def test_a_host_user_cannot_be_a_provisioned_container(cast: Cast) -> None:
    d = open_daemon(cast)
    cid = cast.containers.new_id()
    assert d.ctl("echo", f"create {cid[:12]} memsize=1GiB", "inst_ctl").returncode == 0  # type: ignore[attr-defined]
    attacker = cast.agent(d, uid=NOBODY)
    for claim in (cid[:12], cid):
        reply = attacker.register(claim, memsize=[1])
        assert reply["op"] == "error" and reply["code"] == "identity", reply
        assert f"may not act as {claim}" in reply["message"] and "\n" not in reply["message"]
    container = cast.agent(d, cid=cid)
    reply = container.register()
    assert reply["op"] == "registered" and reply["instance"] == cid[:12]
    container.call("send", msg={"op": "mem_reserve", "id": 7, "gpu": 0, "bytes": 900 * 1024**2})
    assert container.call("recv")["op"] == "ok"  # its limit is all its own: nobody reserved against it


@needs_root
def test_a_host_user_cannot_squat_an_id_before_its_container_comes(cast: Cast) -> None:
    d = open_daemon(cast, "--client-env-max-weight", "25")  # the container's environment may ask for weight 3
    cid = cast.containers.new_id()
    squatter = cast.agent(d, uid=NOBODY)
    reply = squatter.register(cid[:12], memsize=[1], weight=1)
    assert reply["op"] == "error" and reply["code"] == "identity"
    container = cast.agent(d, cid=cid)
    reply = container.register(weight=3, memsize=[GIB])
    assert reply["op"] == "registered"
    assert (reply["gpus"][0]["weight"], reply["gpus"][0]["mem_limit"]) == (3, GIB)  # what its environment asked


@needs_root
def test_a_host_process_is_its_uid_or_an_instance_provisioned_for_it(cast: Cast) -> None:
    d = open_daemon(cast)
    me = cast.agent(d, uid=NOBODY)
    reply = me.register(None, weight=9, memsize=[1])
    assert reply["op"] == "registered" and reply["instance"] == f"uid-{NOBODY}"
    assert (reply["gpus"][0]["weight"], reply["gpus"][0]["mem_limit"]) == (1, 4 * GIB)  # the defaults, not its env
    assert d.ctl("echo", f"create dev uid={NOBODY} weight=2", "inst_ctl").returncode == 0  # type: ignore[attr-defined]
    assert d.ctl("echo", "create ops uid=0", "inst_ctl").returncode == 0  # type: ignore[attr-defined]
    assert cast.agent(d, uid=NOBODY).register("dev")["gpus"][0]["weight"] == 2
    for other, why in (("ops", "it is not yours"), ("uid-0", "may act only as"),
                       ("anything", "inst_ctl create anything uid=65534")):
        reply = cast.agent(d, uid=NOBODY).register(other)
        assert reply["op"] == "error" and reply["code"] == "identity" and why in reply["message"], reply
        assert "uid 0" not in reply["message"]  # a refusal names no other tenant's uid
    cid = cast.containers.new_id()
    reply = cast.agent(d, cid=cid).register("dev")
    assert reply["code"] == "identity"  # a container may not use a host instance either
    assert "container" in d.ctl("echo", f"create {cid[:12]} uid=1", "inst_ctl").stderr  # type: ignore[attr-defined]


def test_host_clients_can_be_refused_entirely(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--host-clients", "refuse")
    reply = cast.agent(d).register(None)
    assert reply["op"] == "error" and reply["code"] == "identity" and "containers only" in reply["message"]
    assert cast.agent(d, cid=cast.containers.new_id()).register()["op"] == "registered"


def test_a_container_cannot_declare_another_container(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB")
    victim, attacker = cast.containers.new_id(), cast.containers.new_id()
    assert cast.agent(d, cid=victim).register()["op"] == "registered"
    reply = cast.agent(d, cid=attacker).register(victim[:12])
    assert reply["code"] == "identity" and f"container {attacker[:12]}" in reply["message"]


def test_a_container_cannot_shed_its_identity_by_connecting_forking_and_exiting(cast: Cast) -> None:
    """The process that connected exits before the daemon accepts; its child holds the connection. The daemon
    cannot read who connected, so it refuses the connection: the child is never taken for a host process."""
    d = cast.daemon("--sim-gpus", "1x1GiB")
    victim = cast.containers.new_id()
    assert d.ctl("echo", f"create {victim[:12]}", "inst_ctl").returncode == 0  # type: ignore[attr-defined]
    shedder = cast.agent(d, cid=cast.containers.new_id())
    assert d.proc is not None  # type: ignore[attr-defined]
    os.kill(d.proc.pid, signal.SIGSTOP)  # type: ignore[attr-defined]
    try:
        assert shedder.call("connect") == {"ok": True}  # in the listen backlog, not yet accepted
        child = shedder.call("fork_exit")["child"]
        shedder.proc.wait(5)  # it exited and was reaped, as a shell reaps it: its PID names nothing now
    finally:
        os.kill(d.proc.pid, signal.SIGCONT)  # type: ignore[attr-defined]
    assert child != shedder.pid
    first = shedder.call("recv")  # the child answers now, on the same pipes
    assert first.get("op") == "error" and first["code"] == "identity" and "exited" in first["message"], first
    assert shedder.call("recv").get("closed")
    refused = [line for line in d.read_log().splitlines() if "refusing client" in line]  # type: ignore[attr-defined]
    assert len(refused) == 1 and "exited" in refused[0]


def test_a_forked_child_keeps_its_parents_container(cast: Cast) -> None:
    """Forking after the daemon accepted changes nothing: the connection is its container's."""
    d = cast.daemon("--sim-gpus", "1x1GiB")
    cid = cast.containers.new_id()
    a = cast.agent(d, cid=cid)
    assert a.call("connect") == {"ok": True}
    a.call("send", msg={"op": "hello", "versions": [1], "client": "t"})
    assert a.call("recv")["op"] == "welcome"
    a.call("fork_exit")
    time.sleep(0.2)
    a.call("send", msg={"op": "register", "id": 1, "instance": "someone-else", "gpus": [0]})
    reply = a.call("recv")
    assert reply["code"] == "identity" and f"container {cid[:12]}" in reply["message"]
    a.call("send", msg={"op": "register", "id": 2, "instance": None, "gpus": [0]})
    assert a.call("recv")["instance"] == cid[:12]


@pytest.mark.parametrize("bad", ["a\n", "a\nb", "x" * 129, "a\x1b[31m"])
def test_an_id_with_control_characters_is_refused_on_every_surface(cast: Cast, bad: str) -> None:
    d = cast.daemon("--sim-gpus", "1x1GiB", "--identity", "declared")
    reply = cast.agent(d).register(bad)
    assert reply["op"] == "error" and reply["code"] == "bad_request" and "invalid instance id" in reply["message"]
    if not bad.endswith("\n"):  # a value's trailing newline is echo's, as on cGPU's tree: stripped
        r = d.ctl("echo", f"create {bad}", "inst_ctl")  # type: ignore[attr-defined]
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1
    assert d.ctl("cat", "inst_ctl").stdout == ""  # type: ignore[attr-defined]


@needs_root
def test_a_host_user_cannot_forge_a_container_cgroup_in_a_subtree_it_owns(cast: Cast) -> None:
    """systemd delegates user@<uid>.service to its user; there the user may make a cgroup named after any container
    and move itself in. The daemon believes only cgroups root made: the forger stays a host process of its uid."""
    if not cast.containers.real or cast.containers.hierarchy is None:
        pytest.skip("needs a writable cgroup hierarchy (root, as in CI)")
    d = cast.daemon("--sim-gpus", "1x4GiB", "--client-mode", "0666")
    victim = cast.containers.new_id()
    assert d.ctl("echo", f"create {victim[:12]} weight=8 memsize=1GiB", "inst_ctl").returncode == 0
    forger = cast.agent(d, uid=NOBODY)
    made, why_not = forge_container(cast.containers.hierarchy, forger, NOBODY, victim)
    try:
        if why_not:
            pytest.skip(why_not)
        reply = forger.register(victim[:12], memsize=[400 << 20])
        assert reply["op"] == "error" and reply["code"] == "identity" and "not in a container" in reply["message"]
        assert forger.register()["instance"] == f"uid-{NOBODY}"
    finally:
        forger.stop()
        remove_cgroups(*made)


@needs_root
def test_a_container_stays_itself_in_any_cgroup_it_makes_under_its_own(cast: Cast) -> None:
    """A container whose cgroup is writable to it (systemd inside, a private cgroup namespace) makes cgroups under
    its own: one named after another container, one it gives to nobody. In either it is still itself: never the
    other container, never a host process (which, under allocations = required, would pass without a token)."""
    if not cast.containers.real or cast.containers.hierarchy is None:
        pytest.skip("needs a writable cgroup hierarchy (root, as in CI)")
    d = cast.daemon("--sim-gpus", "1x4GiB", "--allocations", "required")
    me, other = cast.containers.new_id(), cast.containers.new_id()
    scope = cast.containers.hierarchy / "system.slice" / f"docker-{me}.scope"  # as the runtime makes it: root's
    inside = [scope / "docker" / other, scope / "esc"]
    try:
        scope.mkdir(parents=True)
        for group in inside:
            group.mkdir(parents=True)
        give_cgroup(scope / "esc", NOBODY)
        a = cast.agent(d)
        for group in inside:
            assert a.call("enter_cgroup", dir=str(group)) == {"ok": True}
            reply = a.register()
            assert reply["op"] == "error" and reply["code"] == "identity", reply
            assert f"container {me[:12]}: no valid allocation token" in reply["message"]
    finally:
        for a in cast.agents:
            a.stop()
        remove_cgroups(*inside, scope / "docker", scope, scope.parent)

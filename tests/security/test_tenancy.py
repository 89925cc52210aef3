"""A client shapes its own record and nothing else; weight that has run out is refused clearly; nothing an operator
set is lost: not to a client's record, not to SIGTERM, kill -9, or a bad record in the state file."""

from __future__ import annotations

import signal

from tests.security.conftest import Cast

GIB = 1024**3


def test_a_client_cannot_switch_a_gpu_or_starve_the_next_tenant(cast: Cast) -> None:
    """core=100 on an unused GPU used to put it on policy 3 with max_inst 20 and leave the next container at
    weight 0. Now the GPU keeps its settings, the client is told, and the next container runs."""
    d = cast.daemon("--sim-gpus", "1x4GiB", "--client-env-max-weight", "25")
    grabber = cast.agent(d, cid=cast.containers.new_id())
    reply = grabber.register(core_percent=100)
    assert reply["op"] == "registered" and reply["gpus"][0]["weight"] == 16  # all that is free, no more
    assert any("an operator sets the policy" in w for w in reply["warnings"])
    assert (d.ctl("cat", "0/policy").stdout, d.ctl("cat", "0/max_inst").stdout) == ("1\n", "16\n")
    late = cast.agent(d, cid=cast.containers.new_id())
    reply = late.register()
    assert reply["op"] == "error" and reply["code"] == "refused" and "no free weight" in reply["message"]
    assert "\n" not in reply["message"]
    assert "weight=0" not in d.ctl("cat", "inst_ctl").stdout
    assert d.ctl("echo", "20", "0/max_inst").returncode == 0  # an operator makes room: the late one is let in
    assert late.register()["gpus"][0]["weight"] == 1


def test_a_weight_request_shapes_only_the_clients_own_record(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x4GiB", "--client-env-max-weight", "25")
    reply = cast.agent(d, cid=cast.containers.new_id()).register(weight=3, memsize=[GIB])
    assert reply["gpus"][0]["weight"] == 3 and reply["gpus"][0]["mem_limit"] == GIB
    assert d.ctl("cat", "0/policy").stdout == "1\n"  # weight > 1 no longer switches policy 1 to 2 from a client
    assert d.ctl("echo", "create op weight=2", "inst_ctl").returncode == 0
    assert d.ctl("cat", "0/policy").stdout == "2\n"  # an operator's provisioning does, as behaviour §3 says


def test_the_queue_overcommit_admits_at_weight_0_and_raises_it_when_weight_is_free(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "1x4GiB", "--overcommit", "queue", "--max-inst", "2",
                    "--client-env-max-weight", "25")
    first = cast.agent(d, cid=cast.containers.new_id())
    assert first.register(weight=2)["gpus"][0]["weight"] == 2
    late_id = cast.containers.new_id()
    late = cast.agent(d, cid=late_id)
    reply = late.register()
    assert reply["gpus"][0]["weight"] == 0 and any("no GPU time until" in w for w in reply["warnings"])
    assert d.ctl("echo", "1", "0/max_inst").returncode != 0  # not below the weights: the queued one has none
    assert d.ctl("echo", "3", "0/max_inst").returncode == 0
    assert d.ctl("cat", f"0/{late_id[:12]}/weight").stdout == "1\n"


def test_a_containers_environment_gets_at_most_the_default_weight_and_no_high_priority(cast: Cast) -> None:
    """Before: with trust_client_env on, an unprovisioned container took weight 14 beside a provisioned weight-2
    victim, 87 % of the GPU, and the next container was refused. At the defaults its environment may ask for the
    default weight and no high priority; an operator who wants cGPU's way raises the caps."""
    d = cast.daemon("--sim-gpus", "1x4GiB")
    victim = cast.containers.new_id()
    assert d.ctl("echo", f"create {victim[:12]} weight=2", "inst_ctl").returncode == 0
    greedy = cast.agent(d, cid=cast.containers.new_id()).register(weight=14, highprio=1, memsize=[GIB])
    assert (greedy["gpus"][0]["weight"], greedy["gpus"][0]["highprio"], greedy["gpus"][0]["mem_limit"]) == (1, 0, GIB)
    assert any("client_env_max_weight" in w for w in greedy["warnings"]), greedy
    assert any("client_env_highprio off" in w for w in greedy["warnings"]), greedy
    assert cast.agent(d, cid=cast.containers.new_id()).register()["op"] == "registered"  # room for the next
    cgpu = cast.daemon("--sim-gpus", "1x4GiB", "--client-env-max-weight", "25", "--client-env-highprio", sub="cgpu")
    took = cast.agent(cgpu, cid=cast.containers.new_id()).register(weight=14, highprio=1)
    assert (took["gpus"][0]["weight"], took["gpus"][0]["highprio"]) == (14, 1)  # cGPU's behaviour, when asked for


def test_provisioning_survives_sigterm_kill_9_and_a_bad_record(cast: Cast) -> None:
    d = cast.daemon("--sim-gpus", "2x4GiB")
    for cmd in ("create keep gpu=0 weight=3 memsize=1GiB", "create mine gpu=1 uid=1000 highprio=1"):
        assert d.ctl("echo", cmd, "inst_ctl").returncode == 0
    assert d.ctl("echo", "2", "1/policy").returncode == 0
    listing = d.ctl("cat", "inst_ctl").stdout
    assert "uid=1000" in listing
    assert d.stop(signal.SIGTERM) == 0
    d.start()
    assert d.ctl("cat", "inst_ctl").stdout == listing
    assert d.stop(signal.SIGKILL) != 0
    d.start()
    assert d.ctl("cat", "inst_ctl").stdout == listing and d.ctl("cat", "1/policy").stdout == "2\n"
    d.stop()
    d.add_state_record({"id": "evil\n", "gpu": 0, "weight": 0, "highprio": 0, "memsize": 0, "provisioned": True})
    d.start()
    assert d.ctl("cat", "inst_ctl").stdout == listing and d.ctl("cat", "1/policy").stdout == "2\n"
    log = d.read_log()
    assert "instance record 'evil\\n' on GPU 0 skipped" in log
    kept = [p for p in d.state_dir.iterdir() if p.name.startswith("state.json.bad-")]
    assert len(kept) == 1 and "evil" in kept[0].read_text()  # the file as it was, beside the one in force
    assert "evil" not in d.ctl("cat", "inst_ctl").stdout


def test_stats_show_a_client_its_own_instance_and_nothing_of_the_others(cast: Cast) -> None:
    from arbiterd.server.hub import STATS_GPU_FIELDS

    d = cast.daemon("--sim-gpus", "1x4GiB")
    other = cast.agent(d, cid=cast.containers.new_id())
    assert other.register()["op"] == "registered"
    other.call("send", msg={"op": "mem_reserve", "id": 2, "gpu": 0, "bytes": GIB})
    assert other.call("recv")["op"] == "ok"
    me_id = cast.containers.new_id()
    me = cast.agent(d, cid=me_id)
    assert me.register()["op"] == "registered"
    me.call("send", msg={"op": "stats", "id": 3})
    (gpu,) = me.call("recv")["gpus"]
    assert set(gpu) - {"instances"} <= STATS_GPU_FIELDS and "mem_used" not in gpu and "grants" not in gpu
    assert [i["id"] for i in gpu["instances"]] == [me_id[:12]]
    assert GIB not in [i.get("mem_used") for i in gpu["instances"]]

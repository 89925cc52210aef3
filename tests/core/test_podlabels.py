"""Pod labels (namespace, pod, container) of allocations: checked by Kubernetes' name rules, carried by the
instance an allocation binds to, kept in the state file, and gone with the last allocation."""

from __future__ import annotations

import pytest

from arbiterd.core import binding, podlabels, snapshot, tree
from arbiterd.core.arbiter import Arbiter
from arbiterd.core.errors import CoreError, NotFoundError, SettingError
from arbiterd.core.podlabels import PodLabels
from tests.core.test_allocations import POD_B, ctl, make, register, sha, who

WEB = PodLabels("shop", "web-7d9f-x2x", "model")


@pytest.fixture
def arb() -> Arbiter:
    a = make()
    ctl(a, f"create mem-a token={sha('ta')} gpu=0 memsize=4GiB namespace=shop pod=web-7d9f-x2x container=model")
    ctl(a, f"create core-a token={sha('tc')} gpu=0 core=30")
    return a


def labels_on_records(arb: Arbiter, instance: str) -> set[PodLabels | None]:
    return {r.labels for (_, n), r in arb.records.items() if n == instance}


def test_the_kubernetes_name_rules_are_checked() -> None:
    assert podlabels.check("kube-system", "cgpu.node-1.abc", "arbiterd") == PodLabels("kube-system",
                                                                                       "cgpu.node-1.abc", "arbiterd")
    assert podlabels.check("a", "b").container == ""  # a DRA claim named by several containers: not known
    assert podlabels.check("n" * 63, ".".join(["p" * 63] * 4)[:253].rstrip("."), "c" * 63).pod.startswith("ppp")
    bad = [("Shop", "p", "c"), ("-shop", "p", "c"), ("n" * 64, "p", "c"), ("ns", "p" * 254, "c"), ("ns", "p..q", "c"),
           ("ns", "p", "C"), ("ns", "p", "c" * 64), ("ns", "p\x1b[31m", "c"), ("ns", "p", "a\nb"), ("ns", "p", "c/d"),
           ("ns", 'p"}', "c"), ("", "p", "c"), ("ns", "", "c")]
    for namespace, pod, container in bad:
        with pytest.raises(SettingError, match="is not a Kubernetes name") as err:
            podlabels.check(namespace, pod, container)
        assert "\n" not in str(err.value) and "\x1b" not in str(err.value)  # one line, control characters escaped


def test_create_and_label_give_the_listing_and_status_labels(arb: Arbiter) -> None:
    listing = tree.read(arb, "alloc_ctl", 0)
    assert "mem-a gpu=0 memsize=4294967296 core=0 namespace=shop pod=web-7d9f-x2x container=model bound=-\n" in listing
    assert arb.allocations.get("mem-a").to_json()["labels"] == WEB.to_json()
    assert arb.allocations.get("core-a").labels is None
    ctl(arb, "label core-a namespace=shop pod=web-7d9f-x2x container=model")  # the device plugin, after Allocate
    assert arb.allocations.get("core-a").labels == WEB


def test_the_bound_instance_carries_its_allocations_labels_and_a_later_label_reaches_it(arb: Arbiter) -> None:
    ctl(arb, f"create mem-b token={sha('tb')} gpu=1 memsize=2GiB")
    register(arb, 1, who("aaa", "ta", "tc"))
    register(arb, 2, who("bbb", "tb", pod=POD_B))
    assert labels_on_records(arb, "aaa") == {WEB}
    assert labels_on_records(arb, "bbb") == {None}  # no plugin said yet
    ctl(arb, "label mem-b namespace=batch pod=train-0")
    assert labels_on_records(arb, "bbb") == {PodLabels("batch", "train-0")}


def test_labels_survive_a_restart_and_go_with_the_last_allocation(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    fresh = make()
    assert snapshot.restore(fresh, snapshot.take(arb), 0) == []
    assert labels_on_records(fresh, "aaa") == {WEB}
    assert fresh.allocations.get("mem-a").labels == WEB
    fresh.connect(1, 1001, 0)
    bound = binding.bind(fresh, who("aaa", "ta", "tc"), 0)
    assert bound is not None and not bound.changed and labels_on_records(fresh, "aaa") == {WEB}
    ctl(arb, "remove mem-a")
    assert labels_on_records(arb, "aaa") == {None}  # core-a is still bound, and names no pod
    ctl(arb, "label core-a namespace=shop pod=web-7d9f-x2x")
    assert labels_on_records(arb, "aaa") == {PodLabels("shop", "web-7d9f-x2x")}
    ctl(arb, "remove core-a")  # its client is still there: the record stays, unprovisioned, with no pod
    assert labels_on_records(arb, "aaa") == {None}


def test_a_restarted_container_of_the_same_pod_takes_the_labels_over(arb: Arbiter) -> None:
    register(arb, 1, who("aaa", "ta", "tc"))
    arb.disconnect(1, 0)
    register(arb, 2, who("bbb", "ta", "tc"))
    assert labels_on_records(arb, "bbb") == {WEB} and labels_on_records(arb, "aaa") == set()


def test_bad_labels_in_a_state_file_skip_that_allocation_alone(arb: Arbiter) -> None:
    doc = snapshot.take(arb)
    item = next(a for a in doc["allocations"] if a["id"] == "mem-a")
    item["labels"] = {**WEB.to_json(), "pod": "evil\x1b[2J"}
    fresh = make()
    warnings = snapshot.restore(fresh, doc, 0)
    assert len(warnings) == 1 and "allocation 'mem-a' skipped" in warnings[0] and "Kubernetes name" in warnings[0]
    assert [a.id for a in fresh.allocations] == ["core-a"]


@pytest.mark.parametrize(("command", "error", "words"), [
    ("label mem-a namespace=shop", SettingError, "go together"),
    ("label mem-a pod=web container=c", SettingError, "go together"),
    ("label mem-a", SettingError, "give namespace="),
    ("label mem-a namespace=Shop pod=web", SettingError, "namespace='Shop' is not a Kubernetes name"),
    ("label mem-a namespace=shop pod=web container=a_b", SettingError, "container='a_b'"),
    ("label mem-a namespace=shop pod=web gpu=1", SettingError, "unexpected 'gpu=1'"),
    ("label mem-a namespace=shop pod=web pod=other", SettingError, "unexpected 'pod=other'"),
    ("label nope namespace=shop pod=web", NotFoundError, "no allocation nope"),
    (f"create x token={sha('x')} gpu=1 memsize=1GiB pod=web", SettingError, "go together"),
    (f"create x token={sha('x')} gpu=1 memsize=1GiB namespace=a pod=-web", SettingError, "pod='-web'"),
])
def test_bad_labels_are_refused_with_one_line_and_change_nothing(arb: Arbiter, command: str, error: type[CoreError],
                                                                  words: str) -> None:
    before = snapshot.take(arb)
    with pytest.raises(error, match=words) as err:
        ctl(arb, command)
    assert "\n" not in str(err.value)
    assert snapshot.take(arb) == before

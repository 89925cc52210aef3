"""``cgpu-smi`` on a Kubernetes node: a Pod and a Container column where a plugin named an instance's pod, and
``--pod`` keeping one pod's instances. The documents are built by the daemon's own status code from an arbiter
whose allocations were bound as a node binds them (tests/core/test_allocations.py's helpers)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from arbiterd.core import tree
from arbiterd.server import status
from arbiterd.tools import smi
from tests.core.test_allocations import POD_B, make, register, sha, who


def document() -> dict[str, Any]:
    arb = make()
    tree.write(arb, "alloc_ctl", f"create mem-a token={sha('a')} gpu=0 memsize=4GiB namespace=shop "
                                 "pod=web-7d9f-x2x container=model", 0)
    tree.write(arb, "alloc_ctl", f"create mem-b token={sha('b')} gpu=0 memsize=2GiB namespace=batch "
                                 "pod=train-0", 0)
    register(arb, 1, who("aaaaaaaaaaaa", "a"))
    register(arb, 2, who("bbbbbbbbbbbb", "b", pod=POD_B))
    arb.connect(3, 1003, 1000)
    arb.register(3, "uid-1000", [0], {}, 0)  # a host process: no pod
    doc = status.build(arb, list(arb.gpus.values()), status.History(), clients=3, started_at=time.time(),
                       state_file="state.json", state_problem=None)
    return doc.to_json()


def rows(text: str) -> dict[str, str]:
    """Instance table rows by instance id."""
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("GPU Instance"))
    return {line.split()[1]: line for line in lines[start:] if line[:1].isdigit()}


def test_the_table_names_each_instances_pod_and_container_and_dashes_the_host_instance() -> None:
    text = smi.render(document())
    header = next(line for line in text.splitlines() if line.startswith("GPU Instance"))
    assert header.split()[:5] == ["GPU", "Instance", "Pod", "Container", "Weight"]
    got = {k: v.split()[2:4] for k, v in rows(text).items()}
    assert got == {"aaaaaaaaaaaa": ["shop/web-7d9f-x2x", "model"], "bbbbbbbbbbbb": ["batch/train-0", "-"],
                   "uid-1000": ["-", "-"]}
    weight_at = header.index("Weight") + len("Weight")  # columns stay aligned however long the pod names are
    assert {line[weight_at - 1] for line in rows(text).values()} == {"1"}


def test_without_pods_the_table_has_no_pod_columns() -> None:
    doc = document()
    for g in doc["gpus"]:
        for i in g["instances"]:
            i["labels"] = None
    assert "Pod" not in smi.render(doc)


@pytest.mark.parametrize(("want", "ids"), [("web-7d9f-x2x", {"aaaaaaaaaaaa"}), ("shop/web-7d9f-x2x", {"aaaaaaaaaaaa"}),
                                           ("batch/train-0", {"bbbbbbbbbbbb"}), ("other/train-0", set()),
                                           ("nothere", set())])
def test_pod_keeps_that_pods_instances_alone(want: str, ids: set[str]) -> None:
    doc = smi.only_pod(document(), want)
    assert {i["id"] for g in doc["gpus"] for i in g["instances"]} == ids
    assert len(doc["allocations"]) == len(ids)
    text = smi.render(doc, want)
    assert set(rows(text)) == ids
    if not ids:
        assert f"(no instances of pod {want})" in text


@pytest.mark.parametrize("bad", ["Web", "shop/", "a/b/c", "web\x1b[2J", "-web"])
def test_a_bad_pod_name_is_a_one_line_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        smi.build_parser().parse_args([f"--pod={bad}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("cgpu-smi: error: argument --pod: ") and "Kubernetes name" in err

"""The DRA plugin's pure parts: quantities, ShareConfig, reading an allocated claim, the ResourceSlice; and the
scheduler model's consumable-capacity arithmetic against the upstream allocator's rules."""

from __future__ import annotations

from typing import Any

import pytest

from cgpu_dra_plugin import DRIVER, quantity, shareconfig
from cgpu_dra_plugin.claims import BadClaim, grants
from cgpu_dra_plugin.slices import Gpu, gpu_index, resource_slice
from cgpu_testing.apiserver import validate
from cgpu_testing.drasched import Unschedulable, allocate, claim

GIB = 1 << 30
GPUS = [Gpu(0, "GPU-a", "Tesla T4", 15 * GIB + (500 << 20), 1, "550.54.15", "7.5"), Gpu(1, "GPU-b", "A10", 24 * GIB, 3)]


@pytest.mark.parametrize(("text", "value"), [("4Gi", 4 * GIB), ("30", 30), ("500m", 1), ("1e3", 1000), ("1.5Ki", 1536),
                                             ("2G", 2 * 10**9), (7, 7)])
def test_quantities(text: object, value: int) -> None:
    assert quantity.parse(text) == value


@pytest.mark.parametrize("text", ["", "4GB", "Gi", "1..2", True, None, "4 Gi"])
def test_bad_quantities_say_so(text: object) -> None:
    with pytest.raises(quantity.BadQuantity, match="quantity"):
        quantity.parse(text)


def test_share_config_defaults_and_a_full_one() -> None:
    base = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig"}
    assert shareconfig.parse(base) == shareconfig.DEFAULT
    full = shareconfig.parse({**base, "weight": 2, "highPriority": True, "limits": "MemoryOnly"})
    assert (full.weight, full.high_priority, full.enforce_cores) == (2, True, False)
    assert shareconfig.parse(full.to_json()) == full


@pytest.mark.parametrize(("doc", "words"), [
    ({"apiVersion": "v1", "kind": "ShareConfig"}, "apiVersion must be"),
    ({"weight": 0}, "weight must be an integer 1..25"),
    ({"weight": 26}, "weight must be"),
    ({"weight": "2"}, "weight must be"),
    ({"weight": True}, "weight must be"),
    ({"highPriority": 1}, "highPriority must be true or false"),
    ({"limits": "Cores"}, "limits must be MemoryAndCores or MemoryOnly"),
    ({"wieght": 2}, "unknown field 'wieght'"),
])
def test_a_bad_share_config_gets_one_line_naming_the_field(doc: dict[str, Any], words: str) -> None:
    full = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig", **doc}
    with pytest.raises(shareconfig.BadShareConfig, match=words) as exc:
        shareconfig.parse(full)
    assert "\n" not in str(exc.value)


def test_the_slice_rounds_memory_down_to_whole_gib_and_validates_against_every_schema_it_targets() -> None:
    """A T4's 15.5 GiB is published as 15Gi (requests are whole GiB); the slice is valid for 1.34 to 1.37."""
    s = resource_slice("n1", DRIVER, GPUS, 3)
    assert s["spec"]["devices"][0]["capacity"]["memory"]["value"] == "15Gi"
    assert s["spec"]["devices"][0]["attributes"]["driverVersion"] == {"string": "550.54.15"}
    assert "driverVersion" not in s["spec"]["devices"][1]["attributes"]
    for version in ("1.34", "1.35", "1.36", "1.37"):
        assert validate(s, version) is None
    assert [gpu_index(d["name"]) for d in s["spec"]["devices"]] == [0, 1]
    with pytest.raises(ValueError, match="not one of this driver's"):
        gpu_index("gpu-01")


def schedule(*claims: dict[str, Any]) -> list[dict[str, Any]]:
    slices = [resource_slice("n1", DRIVER, GPUS, 1)]
    done: list[dict[str, Any]] = []
    for i, c in enumerate(claims):
        c = {**c, "metadata": {**c["metadata"], "uid": f"uid-{i}"}}
        c["status"] = {"allocation": allocate(c, slices, done, {DRIVER: DRIVER}, "n1")}
        done.append(c)
    return done


def results(c: dict[str, Any]) -> dict[str, Any]:
    (r,) = c["status"]["allocation"]["devices"]["results"]
    return r  # type: ignore[no-any-return]


def test_the_scheduler_model_rounds_requests_up_by_the_request_policy() -> None:
    """roundUpRange: 1.5Gi consumes 2Gi, 12 cores consume 15, no cores consume the default 0, no memory the
    default 1Gi."""
    a, b = schedule(claim("a", memory="1536Mi", cores=12), claim("b", cores=20))
    assert results(a)["consumedCapacity"] == {"memory": "2Gi", "cores": "15"}
    assert results(b)["consumedCapacity"] == {"memory": "1Gi", "cores": "20"}


def test_the_scheduler_model_never_passes_a_capacity_and_takes_the_first_device_that_fits() -> None:
    """Three 5 GiB claims fill the 15Gi T4; a fourth and a 70-core claim go to GPU 1; then 40 cores fit nowhere
    (GPU 0 has no memory left, GPU 1 would pass 100 cores)."""
    done = schedule(*[claim(f"m{i}", memory="5Gi") for i in range(4)], claim("c1", memory="1Gi", cores=70))
    assert [results(c)["device"] for c in done] == ["gpu-0", "gpu-0", "gpu-0", "gpu-1", "gpu-1"]
    with pytest.raises(Unschedulable, match="no device"):
        schedule(*[claim(f"m{i}", memory="5Gi") for i in range(4)], claim("c1", memory="1Gi", cores=70),
                 claim("c2", memory="1Gi", cores=40))
    assert results(schedule(claim("c1", cores=70), claim("c2", cores=30))[1])["device"] == "gpu-0"


def test_a_request_over_max_or_for_an_unknown_capacity_fits_no_device() -> None:
    with pytest.raises(Unschedulable):
        schedule(claim("a", cores=105))
    c = claim("x", memory="1Gi")
    c["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"]["bandwidth"] = "1"
    with pytest.raises(Unschedulable):
        schedule(c)


def allocated(**share: Any) -> dict[str, Any]:
    cfg = {"apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig", **share} if share else None
    (c,) = schedule(claim("w", memory="4Gi", cores=30 if "weight" not in share else None, config=cfg))
    return c


def test_reading_an_allocated_claim_gives_its_device_capacity_and_share_config() -> None:
    (g,) = grants(allocated(), DRIVER, "n1")
    assert (g.device, g.memory, g.cores, g.config) == ("gpu-0", 4 * GIB, 30, shareconfig.DEFAULT)
    (w,) = grants(allocated(weight=2), DRIVER, "n1")
    assert (w.cores, w.config.weight, w.config.high_priority) == (0, 2, False)


def test_high_priority_is_taken_from_a_device_class_config_only() -> None:
    """A FromClass config's highPriority holds (and a later claim config's weight adds to it); the same in a
    FromClaim config, or with no source, is refused naming the high-priority class."""
    c = allocated(weight=2)
    (claim_cfg,) = c["status"]["allocation"]["devices"]["config"]
    high = {"source": "FromClass", "opaque": {"driver": DRIVER, "parameters": {
        "apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig", "highPriority": True}}}
    c["status"]["allocation"]["devices"]["config"] = [high, claim_cfg]
    (g,) = grants(c, DRIVER, "n1")
    assert (g.config.weight, g.config.high_priority) == (2, True)
    for source in ("FromClaim", None):
        forged = {**high, "source": source} if source else {"opaque": high["opaque"]}
        c["status"]["allocation"]["devices"]["config"] = [forged]
        with pytest.raises(BadClaim, match=f"^ShareConfig: highPriority is taken only from a DeviceClass .*"
                                           f"{DRIVER}-highprio instead$"):
            grants(c, DRIVER, "n1")


def test_a_claim_that_cannot_be_prepared_here_says_why() -> None:
    with pytest.raises(BadClaim, match="not this node's"):
        grants(allocated(), DRIVER, "n2")
    with pytest.raises(BadClaim, match="weight must be"):
        grants(allocated(weight=99), DRIVER, "n1")
    c = allocated()
    c["spec"]["devices"]["config"] = c["status"]["allocation"]["devices"]["config"] = [
        {"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": {
            "apiVersion": f"{DRIVER}/v1alpha1", "kind": "ShareConfig", "weight": 2}}}]
    with pytest.raises(BadClaim, match="exclude each other"):
        grants(c, DRIVER, "n1")
    c["status"]["reservedFor"] = [{"resource": "pods", "name": n, "uid": n} for n in ("p1", "p2")]
    with pytest.raises(BadClaim, match=r"^claim default/w is reserved for 2 consumers \(pods/p1, pods/p2\); .* "
                                       "each pod needs its own claim"):
        grants(c, DRIVER, "n1")
    c["status"]["reservedFor"] = c["status"]["reservedFor"][:1]
    with pytest.raises(BadClaim, match="exclude each other"):  # one consumer: on to the next check
        grants(c, DRIVER, "n1")
    del c["status"]
    with pytest.raises(BadClaim, match="not allocated"):
        grants(c, DRIVER, "n1")


@pytest.mark.parametrize("gib", [1, 2, 15, 80])
def test_a_slice_of_any_card_size_passes_the_api_servers_request_policy_rules(gib: int) -> None:
    s = resource_slice("n1", DRIVER, [Gpu(0, "GPU-a", "x", gib * GIB + 123, 1)], 1)
    assert validate(s) is None
    assert resource_slice("n1", DRIVER, [Gpu(0, "GPU-a", "x", GIB - 1, 1)], 1)["spec"]["devices"] == []


def test_the_fake_api_server_refuses_what_the_real_one_would() -> None:
    """An unknown field fails the schema (422, recorded); a step past the capacity fails the policy rules."""
    import json
    import urllib.error
    import urllib.request

    from cgpu_testing.apiserver import FakeApiServer

    good = resource_slice("n1", DRIVER, GPUS, 1)
    bad_field = {**good, "spec": {**good["spec"], "bogus": 1}}
    bad_step = json.loads(json.dumps(good))
    bad_step["spec"]["devices"][0]["capacity"]["cores"]["requestPolicy"]["validRange"]["step"] = "7"
    assert validate(bad_step) is not None and "multiple of step" in str(validate(bad_step))
    with FakeApiServer() as api:
        req = urllib.request.Request(f"{api.url}/apis/resource.k8s.io/v1/resourceslices", method="POST",
                                     data=json.dumps(bad_field).encode(), headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=10)
        assert exc.value.code == 422 and len(api.invalid) == 1 and "bogus" in api.invalid[0]
        assert api.list("resourceslices") == []


def test_the_command_line_refuses_a_missing_node_name_and_a_bad_interval_with_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cgpu_dra_plugin.main import main

    monkeypatch.delenv("NODE_NAME", raising=False)
    assert main([]) == 2
    assert capsys.readouterr().err.strip().endswith("(the DaemonSet sets it from spec.nodeName)")
    assert main(["--node-name", "n1", "--poll-interval-s", "0"]) == 2
    assert capsys.readouterr().err.strip() == "cgpu-dra-plugin: --poll-interval-s must be 0.01..3600 seconds"

"""The wire codec agrees with proto/schema.json, and the decoder enforces its limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from libcgpu_client import wire

SCHEMA = json.loads((Path(__file__).parent.parent / "proto" / "schema.json").read_text())

SAMPLES: dict[str, dict[str, Any]] = {
    "hello": {"op": "hello", "versions": [1], "client": "t", "pid": 1},
    "register": {"op": "register", "id": 1, "instance": "a", "gpus": [0, "GPU-x"], "weight": 2,
                 "highprio": 0, "memsize": [1024]},
    "acquire": {"op": "acquire", "id": 2, "gpu": 0},
    "release": {"op": "release", "gpu": 0, "lease": 3, "used_ns": 10, "again": True, "id": 4},
    "mem_reserve": {"op": "mem_reserve", "id": 5, "gpu": 0, "bytes": 100},
    "mem_free": {"op": "mem_free", "id": 6, "gpu": 0, "bytes": 100},
    "stats": {"op": "stats", "id": 7},
    "bye": {"op": "bye"},
    "welcome": {"op": "welcome", "version": 1, "server": "s", "max_message": 65536, "clock": "CLOCK_MONOTONIC"},
    "registered": {"op": "registered", "re": 1, "instance": "a", "gpus": [{"gpu": 0}], "warnings": []},
    "grant": {"op": "grant", "gpu": 0, "lease": 3, "deadline_ns": 2**62},
    "revoke": {"op": "revoke", "gpu": 0, "lease": 3, "reason": "highprio"},
    "ok": {"op": "ok", "re": 5, "used": 1, "limit": 2},
    "denied": {"op": "denied", "re": 5, "used": 1, "limit": 2, "reason": "out of memory"},
    "stats_reply": {"op": "stats", "re": 7, "gpus": []},
    "error": {"op": "error", "re": None, "code": "bad_frame", "message": "m"},
}


def test_schema_and_codec_list_the_same_messages_and_fields() -> None:
    from_code: dict[str, dict[str, Any]] = {}
    for op, spec in wire.MESSAGES.items():
        fields = wire.STATS_REQUEST if op == "stats" else spec["fields"]
        from_code[op] = {"direction": spec["dir"], "reply": spec["reply"],
                         "fields": {k: {"type": t, "required": r} for k, (t, r) in fields.items()}}
    from_code["stats_reply"] = {"op": "stats", "direction": "s2c", "reply": None,
                                "fields": {k: {"type": t, "required": r} for k, (t, r) in wire.STATS_REPLY.items()}}
    assert from_code == SCHEMA["messages"]
    assert SCHEMA["max_message_bytes"] == wire.MAX_MESSAGE
    assert SCHEMA["version"] == wire.PROTOCOL_VERSION
    assert set(SCHEMA["error_codes"]) == set(wire.ERROR_CODES)


@pytest.mark.parametrize("name", sorted(SCHEMA["messages"]))
def test_every_schema_message_round_trips(name: str) -> None:
    msg = SAMPLES[name]
    direction = SCHEMA["messages"][name]["direction"]
    data = wire.encode(msg, direction)
    (back,) = list(wire.Decoder(direction).feed(data))
    assert back == msg


@pytest.mark.parametrize("name", sorted(SCHEMA["messages"]))
def test_every_required_field_is_enforced(name: str) -> None:
    spec = SCHEMA["messages"][name]
    for field, info in spec["fields"].items():
        if info["required"]:
            msg = {k: v for k, v in SAMPLES[name].items() if k != field}
            with pytest.raises(wire.ProtocolError):
                wire.validate(msg, spec["direction"])


@pytest.mark.parametrize("bad", [
    {"op": "acquire", "id": "1", "gpu": 0}, {"op": "acquire", "id": 1, "gpu": True},
    {"op": "acquire", "id": 1, "gpu": 0, "extra": 1}, {"op": 3}, {"nop": 1}, [1, 2], "x",
    {"op": "register", "id": 1, "instance": 5, "gpus": [0]},
])
def test_invalid_messages_are_protocol_errors(bad: Any) -> None:
    with pytest.raises(wire.ProtocolError):
        wire.validate(bad, "c2s")


def test_unknown_op_has_its_own_code() -> None:
    with pytest.raises(wire.ProtocolError) as exc:
        wire.validate({"op": "launch_missiles"}, "c2s")
    assert exc.value.code == "unknown_op"


def test_decoder_reassembles_split_frames() -> None:
    data = b"".join(wire.encode(SAMPLES[n], "c2s") for n in ("hello", "register", "acquire"))
    dec = wire.Decoder("c2s")
    out = []
    for i in range(len(data)):
        out += list(dec.feed(data[i:i + 1]))
    assert [m["op"] for m in out] == ["hello", "register", "acquire"]


def test_oversized_frame_is_rejected() -> None:
    big = msgpack.packb({"op": "register", "id": 1, "instance": "a" * (wire.MAX_MESSAGE + 10), "gpus": [0]})
    with pytest.raises(wire.ProtocolError) as exc:
        list(wire.Decoder("c2s").feed(big))
    assert exc.value.code == "too_large"


def test_oversized_partial_frame_is_rejected_before_it_completes() -> None:
    big = msgpack.packb({"op": "register", "id": 1, "instance": "a" * (3 * wire.MAX_MESSAGE), "gpus": [0]})
    dec = wire.Decoder("c2s")
    with pytest.raises(wire.ProtocolError):
        for i in range(0, 2 * wire.MAX_MESSAGE + 4096, 4096):
            list(dec.feed(big[i:i + 4096]))


@pytest.mark.parametrize("garbage", [b"\xc1", b"\xff" * 10, b"\x92\x01\x02", b"\xa3abc"])
def test_garbage_is_rejected(garbage: bytes) -> None:
    with pytest.raises(wire.ProtocolError):
        for msg in wire.Decoder("c2s").feed(garbage):
            wire.validate(msg, "c2s")


def test_encode_refuses_oversized_messages() -> None:
    with pytest.raises(wire.ProtocolError):
        wire.encode({"op": "revoke", "gpu": 0, "lease": 1, "reason": "x" * wire.MAX_MESSAGE}, "s2c")

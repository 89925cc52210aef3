"""The protocol package: every message round-trips and is validated, schema.json is generated from it,
PROTOCOL.md names what the code sends, and the decoder enforces its limits."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import cgpu_protocol as p
from cgpu_protocol import messages
from cgpu_protocol.schema import render

ROOT = Path(__file__).parent.parent
SCHEMA = json.loads((ROOT / "proto" / "schema.json").read_text())

SAMPLES: dict[str, dict[str, Any]] = {
    "hello": {"op": "hello", "versions": [1], "client": "t", "pid": 1},
    "register": {"op": "register", "id": 1, "instance": "a", "gpus": [0, "GPU-x"], "weight": 2,
                 "highprio": 0, "memsize": [1024], "core_percent": 30},
    "acquire": {"op": "acquire", "gpu": 0},
    "release": {"op": "release", "gpu": 0, "lease": 3, "used_ns": 10, "again": True, "id": 4},
    "mem_reserve": {"op": "mem_reserve", "id": 5, "gpu": 0, "bytes": 100},
    "mem_free": {"op": "mem_free", "gpu": 0, "bytes": 100, "id": 6},
    "mem_query": {"op": "mem_query", "id": 8, "gpu": 0},
    "stats": {"op": "stats", "id": 7},
    "bye": {"op": "bye"},
    "welcome": {"op": "welcome", "version": 1, "server": "s", "max_message": 65536, "clock": "CLOCK_MONOTONIC"},
    "registered": {"op": "registered", "re": 1, "instance": "a", "gpus": [{"gpu": 0}], "warnings": []},
    "grant": {"op": "grant", "gpu": 0, "lease": 3, "deadline_ns": 2**62},
    "revoke": {"op": "revoke", "gpu": 0, "lease": 3, "reason": "highprio"},
    "ok": {"op": "ok", "re": 5, "used": 1, "limit": 2},
    "denied": {"op": "denied", "re": 5, "used": 1, "limit": 2, "reason": "out of memory"},
    "stats_reply": {"op": "stats_reply", "re": 7, "gpus": []},
    "error": {"op": "error", "code": "bad_frame", "message": "m", "re": 3},
}


def test_schema_json_is_generated_from_the_message_classes() -> None:
    assert (ROOT / "proto" / "schema.json").read_text() == render(), \
        "regenerate: python -m cgpu_protocol.schema > proto/schema.json"


def test_requests_and_replies_are_distinct_ops() -> None:
    requests = {op for op, cls in p.MESSAGES.items() if cls.DIRECTION == p.C2S}
    replies = {op for op, cls in p.MESSAGES.items() if cls.DIRECTION == p.S2C}
    assert not requests & replies
    for op in requests:
        reply = p.MESSAGES[op].REPLY
        assert reply is None or all(r in replies for r in reply.split("|")), op


def test_protocol_md_names_every_op_error_code_and_revoke_reason() -> None:
    doc = (ROOT / "proto" / "PROTOCOL.md").read_text()
    named = set(re.findall(r"`([a-z_]+)`", doc))
    assert set(p.MESSAGES) <= named
    assert set(p.ERROR_CODES) <= named
    assert set(p.REVOKE_REASONS) <= named


def test_the_core_revokes_only_with_documented_reasons() -> None:
    from arbiterd.core.model import REVOKE_REASONS

    assert REVOKE_REASONS == p.REVOKE_REASONS


@pytest.mark.parametrize("name", sorted(p.MESSAGES))
def test_every_message_round_trips(name: str) -> None:
    raw = SAMPLES[name]
    cls = p.MESSAGES[name]
    msg = p.decode(raw, cls.DIRECTION)
    assert isinstance(msg, cls)
    (back,) = list(p.Decoder().feed(msg.pack()))
    assert back == raw


@pytest.mark.parametrize("name", sorted(p.MESSAGES))
def test_equal_messages_hash_alike(name: str) -> None:
    """Frozen to the type checker, so hashable at run time too (where every field is)."""
    cls = p.MESSAGES[name]
    a, b = (p.decode(dict(SAMPLES[name]), cls.DIRECTION) for _ in range(2))
    if all(isinstance(getattr(a, f), int | str | float | None) for f in cls.FIELDS):
        assert hash(a) == hash(b) and len({a, b}) == 1
    else:
        with pytest.raises(TypeError):
            hash(a)


@pytest.mark.parametrize("name", sorted(p.MESSAGES))
def test_every_required_field_is_enforced(name: str) -> None:
    cls = p.MESSAGES[name]
    for field in cls.REQUIRED:
        msg = {k: v for k, v in SAMPLES[name].items() if k != field}
        with pytest.raises(p.ProtocolError) as exc:
            p.decode(msg, cls.DIRECTION)
        assert exc.value.code == "bad_request" and field in exc.value.message


def test_optional_fields_at_their_default_stay_off_the_wire() -> None:
    assert p.Acquire(0).to_wire() == {"op": "acquire", "gpu": 0}
    assert p.Release(0, 1, 2).to_wire() == {"op": "release", "gpu": 0, "lease": 1, "used_ns": 2}
    assert p.MemFree(0, 9).to_wire() == {"op": "mem_free", "gpu": 0, "bytes": 9}


def test_the_grant_spelled_out_is_the_generic_wire_form() -> None:
    grant = p.Grant(3, 7, 2**62)
    assert grant.to_wire() == p.Message.to_wire(grant)
    assert list(grant.to_wire()) == list(p.Message.to_wire(grant))  # same key order on the wire


def test_a_version_1_acquire_with_an_id_is_still_accepted() -> None:
    assert p.decode({"op": "acquire", "id": 0, "gpu": 1}, p.C2S) == p.Acquire(1, 0)


_VALUES = st.one_of(st.integers(-(2**64), 2**65), st.booleans(), st.none(), st.text(max_size=2), st.floats(0, 1),
                   st.lists(st.integers(0, 3), max_size=2))


@given(st.sampled_from(["acquire", "release"]),
       st.dictionaries(st.sampled_from(["gpu", "lease", "used_ns", "again", "id", "warmup_ns", "spin_ns", "bytes",
                                        "x"]), _VALUES, max_size=8),
       st.sampled_from([p.C2S, p.S2C, None, "sideways"]))
@example("acquire", {"gpu": 0}, "sideways")
@example("release", {"gpu": 0, "lease": 1, "used_ns": 2, "again": True, "id": 3, "warmup_ns": -4}, p.S2C)
@example("release", {"gpu": 0, "lease": 1, "used_ns": 2, "id": None}, p.C2S)
@example("release", {"gpu": 0, "lease": 1, "used_ns": 2, "warmup_ns": 3, "spin_ns": 4}, p.C2S)
@example("release", {"gpu": 0, "lease": 1, "used_ns": 2, "spin_ns": None}, p.C2S)
@example("acquire", {"gpu": 0, "id": 1}, None)
def test_the_grant_path_s_quick_forms_agree_with_the_field_table(op: str, fields: dict[str, Any],
                                                                 direction: str | None) -> None:
    """decode tries acquire and release in the shape clients send them before the general validator: for any
    frame the two give the same message, or the same error."""
    raw = {"op": op, **fields}

    def outcome(fn: Any) -> Any:
        try:
            return fn(raw, direction)
        except p.ProtocolError as exc:
            return exc.code, exc.message

    assert outcome(p.decode) == outcome(messages.validate)
    assert raw == {"op": op, **fields}  # the frame is left as it came


@pytest.mark.parametrize("bad", [
    {"op": "acquire", "id": "1", "gpu": 0}, {"op": "acquire", "id": 1, "gpu": True},
    {"op": "acquire", "id": 1, "gpu": 0, "extra": 1}, {"op": 3}, {"nop": 1}, [1, 2], "x",
    {"op": "register", "id": 1, "instance": 5, "gpus": [0]}, {"op": "acquire", "gpu": 2**64},
])
def test_invalid_messages_are_protocol_errors(bad: Any) -> None:
    with pytest.raises(p.ProtocolError):
        p.decode(bad, p.C2S)


def test_unknown_op_and_wrong_direction_have_their_own_code() -> None:
    for raw in ({"op": "launch_missiles"}, SAMPLES["grant"]):
        with pytest.raises(p.ProtocolError) as exc:
            p.decode(raw, p.C2S)
        assert exc.value.code == "unknown_op"


def test_decoder_reassembles_split_frames() -> None:
    data = b"".join(p.decode(SAMPLES[n], p.C2S).pack() for n in ("hello", "register", "acquire"))
    dec = p.Decoder()
    out = []
    for i in range(len(data)):
        out += list(dec.feed(data[i:i + 1]))
    assert [m["op"] for m in out] == ["hello", "register", "acquire"]


@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=8), st.lists(st.integers(1, 40), max_size=30))
def test_frames_cut_anywhere_come_out_whole_and_in_order(leases: list[int], cuts: list[int]) -> None:
    """Reads that hold several frames, end inside one, or both: every frame comes out once, in order."""
    frames = [p.Release(0, lease, 0).pack() for lease in leases]
    data = b"".join(frames)
    dec = p.Decoder()
    out: list[Any] = []
    at = 0
    for n in [*cuts, len(data)]:
        out += list(dec.feed(data[at:at + n]))
        at = min(at + n, len(data))
        # what is buffered is exactly the start of the first frame not yet out
        assert dec.pending_bytes == at - sum(map(len, frames[:len(out)]))
    assert [m["lease"] for m in out] == leases and dec.pending_bytes == 0


def test_oversized_frame_is_rejected() -> None:
    big = msgpack.packb({"op": "register", "id": 1, "instance": "a" * (p.MAX_MESSAGE + 10), "gpus": [0]})
    with pytest.raises(p.ProtocolError) as exc:
        list(p.Decoder().feed(big))
    assert exc.value.code == "too_large"


def test_oversized_partial_frame_is_rejected_before_it_completes() -> None:
    big = msgpack.packb({"op": "register", "id": 1, "instance": "a" * (3 * p.MAX_MESSAGE), "gpus": [0]})
    dec = p.Decoder()
    with pytest.raises(p.ProtocolError):
        for i in range(0, 2 * p.MAX_MESSAGE + 4096, 4096):
            list(dec.feed(big[i:i + 4096]))


def test_a_partial_frame_of_many_small_parts_is_rejected_once_it_passes_the_limit() -> None:
    """The unpacker parses a frame's parts as they arrive, and keeps them: a frame of many small strings
    would otherwise grow without bound (up to 4096 of 64 KiB) while no single part is too large."""
    big = msgpack.packb(["x" * 1000] * 4096)
    dec = p.Decoder()
    fed = 0
    with pytest.raises(p.ProtocolError) as exc:
        for i in range(0, len(big), 4096):
            fed += 4096
            list(dec.feed(big[i:i + 4096]))
    assert exc.value.code == "too_large" and fed <= p.MAX_MESSAGE + 4096


@pytest.mark.parametrize("garbage", [b"\xc1", b"\xff" * 10, b"\x92\x01\x02", b"\xa3abc"])
def test_garbage_is_rejected(garbage: bytes) -> None:
    with pytest.raises(p.ProtocolError):
        for raw in p.Decoder().feed(garbage):
            p.decode(raw, p.C2S)


def test_frames_before_garbage_in_the_same_read_still_come_out() -> None:
    good = p.Acquire(0).pack() + p.Acquire(1).pack()
    out = []
    with pytest.raises(p.ProtocolError) as exc:
        for raw in p.Decoder().feed(good + b"\xc1"):
            out.append(raw)
    assert [m["gpu"] for m in out] == [0, 1] and exc.value.code == "bad_frame"


def test_client_settings_register_every_field_they_hold() -> None:
    """Both Python clients register through ClientSettings (core_percent included)."""
    from libcgpu_client.session import ClientSettings

    s = ClientSettings("a", (0, 1), 6, True, (1024,), 30)
    assert s.register(1).to_wire() == {"op": "register", "id": 1, "instance": "a", "gpus": [0, 1], "weight": 6,
                                       "highprio": 1, "memsize": [1024], "core_percent": 30}
    assert ClientSettings(None).register(2).to_wire() == {"op": "register", "id": 2, "instance": None,
                                                          "gpus": [0], "weight": 1, "highprio": 0}

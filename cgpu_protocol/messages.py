"""Every message of the cgpu protocol, version 1, as a typed constructor with its validation.

A message is a dataclass registered under its ``op``, frozen to the type
checker (slotted, but not frozen at run time: a frozen dataclass is built
through ``object.__setattr__`` field by field, which made building one the
costliest step of decoding an acquire). Its fields are the wire fields. A
field with no default is required (``X | None`` without a default: required,
may be nil); a field with a default is optional and left
off the wire while it holds that default. :func:`decode` checks a decoded
frame against its class and builds it; :meth:`Message.pack` frames one.
``proto/schema.json`` is generated from these classes (schema.py).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeGuard, TypeVar

from cgpu_protocol.codec import ProtocolError, pack

C2S, S2C = "c2s", "s2c"
REVOKE_REASONS = ("highprio", "policy", "overrun", "removed", "turn")
Checker = Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One wire field: its schema type (``int``, ``list[int|str]``, ``str|nil``...) and whether it is required."""

    type: str
    required: bool
    default: Any
    check: Checker


class Message:
    """Base of every message. Subclasses are registered by :func:`message`."""

    __slots__ = ()
    OP: ClassVar[str]
    DIRECTION: ClassVar[str]
    REPLY: ClassVar[str | None]
    FIELDS: ClassVar[dict[str, FieldSpec]]
    REQUIRED: ClassVar[tuple[str, ...]]

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.OP}
        for name, spec in self.FIELDS.items():
            value = getattr(self, name)
            if spec.required or value != spec.default:
                out[name] = value
        return out

    def pack(self) -> bytes:
        return pack(self.to_wire())


MESSAGES: dict[str, type[Message]] = {}
T = TypeVar("T", bound=Message)


INT_MIN, INT_END = -(2**63), 2**64  # what a msgpack int can hold


def _is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int and INT_MIN <= value < INT_END  # (a bool is not an int here)


def _type_name(hint: Any) -> str:
    """The schema type of a Python annotation."""
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        args = typing.get_args(hint)
        return "|".join(_type_name(a) for a in args if a is not type(None)) + (
            "|nil" if type(None) in args else "")
    if origin is list:
        return f"list[{_type_name(typing.get_args(hint)[0])}]"
    if origin is dict or hint is dict:
        return "map"
    return {int: "int", str: "str", bool: "bool"}[hint]


def compile_type(tname: str) -> Checker:
    """A function checking a value against a schema type name."""
    if tname.endswith("|nil"):
        inner = compile_type(tname[:-4])
        return lambda v: v is None or inner(v)
    if tname.startswith("list[") and tname.endswith("]"):
        alternatives = [compile_type(t) for t in tname[5:-1].split("|")]
        return lambda v: isinstance(v, list) and all(any(c(x) for c in alternatives) for x in v)
    if "|" in tname:
        alternatives = [compile_type(t) for t in tname.split("|")]
        return lambda v: any(c(v) for c in alternatives)
    simple: dict[str, Checker] = {
        "int": _is_int, "str": lambda v: isinstance(v, str), "bool": lambda v: isinstance(v, bool),
        "map": lambda v: isinstance(v, dict),
    }
    return simple[tname]


@typing.dataclass_transform(frozen_default=True)
def message(op: str, direction: str, reply: str | None = None) -> Callable[[type[T]], type[T]]:
    """Make ``cls`` a slotted dataclass (frozen to the type checker, and hashable by its fields as the type checker
    takes a frozen one to be) registered under ``op``, with its field table taken from its annotations."""

    def register(plain: type[T]) -> type[T]:
        cls = dataclass(slots=True, unsafe_hash=True)(plain)
        hints = typing.get_type_hints(cls)
        table: dict[str, FieldSpec] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            required = f.default is dataclasses.MISSING
            default = None if required else f.default
            hint = hints[f.name]
            if not required and typing.get_origin(hint) in (types.UnionType, typing.Union):
                hint = typing.Union[tuple(a for a in typing.get_args(hint) if a is not type(None))]  # noqa: UP007
            tname = _type_name(hint)
            table[f.name] = FieldSpec(tname, required, default, compile_type(tname))
        cls.OP, cls.DIRECTION, cls.REPLY, cls.FIELDS = op, direction, reply, table
        cls.REQUIRED = tuple(k for k, s in table.items() if s.required)
        MESSAGES[op] = cls
        return cls

    return register


def decode(raw: Any, direction: str | None = None) -> Message:
    """The message a decoded frame holds; raises ProtocolError saying what is wrong with it.

    The two messages of the grant path are first tried in the shape clients send them, checked field
    by field (:data:`_AS_SENT`); anything else, and every error, goes through :func:`validate`."""
    if type(raw) is dict and (direction == C2S or direction is None):
        op = raw.get("op")
        quick = _AS_SENT.get(op) if type(op) is str else None
        if quick is not None and (msg := quick(raw)) is not None:
            return msg
    return validate(raw, direction)


def validate(raw: Any, direction: str | None = None) -> Message:
    """:func:`decode` by the message's field table alone: what the quick forms must agree with."""
    if not isinstance(raw, dict):
        raise ProtocolError("bad_frame", f"expected a map, got {type(raw).__name__}")
    op = raw.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_frame", "message has no string 'op'")
    cls = MESSAGES.get(op)
    if cls is None:
        raise ProtocolError("unknown_op", f"unknown op {op[:40]!r}")
    if direction is not None and direction != cls.DIRECTION:
        raise ProtocolError("unknown_op", f"op {op!r} is not sent in this direction")
    table = cls.FIELDS
    values = {}
    for key, value in raw.items():
        spec = table.get(key)
        if spec is None:
            if key == "op":
                continue
            raise ProtocolError("bad_request", f"{op}: unexpected field {str(key)[:40]!r}")
        if not spec.check(value):
            raise ProtocolError("bad_request", f"{op}: field {key!r} must be {spec.type}")
        values[key] = value
    for key in cls.REQUIRED:
        if key not in values:
            raise ProtocolError("bad_request", f"{op}: missing field {key!r}")
    return cls(**values)


def request_id(raw: Any) -> int | None:
    """The ``id`` of a frame that may not be a valid message, to answer it with ``re``."""
    rid = raw.get("id") if isinstance(raw, dict) else None
    return rid if _is_int(rid) else None


# ----------------------------------------------------------- client -> daemon
@message("hello", C2S, reply="welcome")
class Hello(Message):
    """The first message: the protocol versions the client speaks."""

    versions: list[int]
    client: str
    pid: int | None = None


@message("register", C2S, reply="registered")
class Register(Message):
    """Once per connection: the instance the client declares (or nil), its GPUs, and the settings it
    would like (used only for an instance nobody provisioned, and only while the daemon trusts
    client environments)."""

    id: int
    instance: str | None
    gpus: list[int | str]
    weight: int | None = None
    highprio: int | None = None
    memsize: list[int] | None = None
    core_percent: int | None = None
    limit: int | None = None  # the most GPU time (%) it asks to be held to: only ever a lower ceiling


@message("acquire", C2S, reply="grant")
class Acquire(Message):
    """The client wants to run work on ``gpu``: a grant comes when it is the instance's turn."""

    gpu: int
    id: int | None = None  # ignored: version-1 clients sent it, but a grant carries no ``re``


@message("release", C2S, reply="ok")
class Release(Message):
    """Give ``lease`` back after holding it ``used_ns`` (grant received to release sent); with ``again``
    the client still has work and keeps its place in the round. ``warmup_ns`` is what the client lost at
    the lease's start: from the grant's arrival to its first use, and its first operations' slowness.
    ``spin_ns`` is the collective spin the client counted on ``gpu`` since its last release there (its
    collectives' wait for a peer's same collective, as launches show it: behaviour §11); absent, none.
    Answered ``ok`` only when it has an ``id``."""

    gpu: int
    lease: int
    used_ns: int
    again: bool = False
    id: int | None = None
    warmup_ns: int | None = None
    spin_ns: int | None = None


def _acquire_as_sent(raw: dict[str, Any]) -> Acquire | None:
    """``{op, gpu}`` or ``{op, gpu, id}`` with int values as an Acquire; None for any other shape."""
    gpu, rid = raw.get("gpu"), raw.get("id")
    # _is_int spelled out here and below: these run for every frame of the grant path, and a call costs more
    # than the test
    if (type(gpu) is int and INT_MIN <= gpu < INT_END and len(raw) == (2 if rid is None else 3)
            and (rid is None or (type(rid) is int and INT_MIN <= rid < INT_END))):
        return Acquire(gpu, rid)
    return None


def _release_as_sent(raw: dict[str, Any]) -> Release | None:
    """A release whose fields are all known and well typed, as a Release; None for any other shape."""
    gpu, lease, used = raw.get("gpu"), raw.get("lease"), raw.get("used_ns")
    if not (type(gpu) is int and type(lease) is int and type(used) is int and INT_MIN <= gpu < INT_END
            and INT_MIN <= lease < INT_END and INT_MIN <= used < INT_END):
        return None
    if len(raw) == 4:  # the usual shape, {op, gpu, lease, used_ns}: no other key is left to read
        return Release(gpu, lease, used)
    again, rid, warmup, spin = raw.get("again", False), raw.get("id"), raw.get("warmup_ns"), raw.get("spin_ns")
    # the length test leaves no room for a key not read above (and an explicit nil id, warmup or spin is one)
    if (type(again) is bool and (rid is None or _is_int(rid)) and (warmup is None or _is_int(warmup))
            and (spin is None or _is_int(spin))
            and len(raw) == 4 + ("again" in raw) + (rid is not None) + (warmup is not None) + (spin is not None)):
        return Release(gpu, lease, used, again, rid, warmup, spin)
    return None


_AS_SENT: dict[str, Callable[[dict[str, Any]], Message | None]] = {
    "acquire": _acquire_as_sent, "release": _release_as_sent}


@message("mem_reserve", C2S, reply="ok|denied")
class MemReserve(Message):
    """Reserve ``bytes`` against the instance's memory limit on ``gpu``."""

    id: int
    gpu: int
    bytes: int


@message("mem_free", C2S, reply="ok")
class MemFree(Message):
    """Give reserved bytes back. Answered only when it has an ``id``."""

    gpu: int
    bytes: int
    id: int | None = None


@message("mem_query", C2S, reply="ok")
class MemQuery(Message):
    """The instance's memory use and limit on ``gpu``, unchanged."""

    id: int
    gpu: int


@message("stats", C2S, reply="stats_reply")
class Stats(Message):
    """The status of the client's own GPUs and instance."""

    id: int


@message("bye", C2S)
class Bye(Message):
    """The client is leaving: the daemon closes the connection."""


# ----------------------------------------------------------- daemon -> client
@message("welcome", S2C)
class Welcome(Message):
    """The answer to hello: the version both speak, and the daemon's limits and clock."""

    version: int
    server: str
    max_message: int
    clock: str


@message("registered", S2C)
class Registered(Message):
    """The answer to register: the instance the daemon resolved, and per GPU what it granted
    (``gpu``, ``uuid``, ``name``, ``weight``, ``highprio``, ``mem_limit``, ``total_mem``)."""

    re: int
    instance: str
    gpus: list[dict[str, Any]]
    warnings: list[str]


@message("grant", S2C)
class Grant(Message):
    """The instance holds ``lease`` on ``gpu`` until ``deadline_ns`` (CLOCK_MONOTONIC). A grant for the
    lease already held moves its deadline."""

    gpu: int
    lease: int
    deadline_ns: int

    def to_wire(self) -> dict[str, Any]:
        # the grant path's reply, sent for every acquire: its fields spelled out, not walked
        # (a test checks this against the generic form)
        return {"op": "grant", "gpu": self.gpu, "lease": self.lease, "deadline_ns": self.deadline_ns}


@message("revoke", S2C)
class Revoke(Message):
    """Give ``lease`` back at the next operation boundary; ``reason`` is one of REVOKE_REASONS."""

    gpu: int
    lease: int
    reason: str


@message("ok", S2C)
class Ok(Message):
    """A request was done (memory requests say the instance's use and limit)."""

    re: int
    used: int | None = None
    limit: int | None = None


@message("denied", S2C)
class Denied(Message):
    """A memory reservation would pass the limit; nothing changed."""

    re: int
    used: int
    limit: int
    reason: str


@message("error", S2C)
class Error(Message):
    """A request was refused, or a frame was bad (``code`` is one of ERROR_CODES); one line."""

    code: str
    message: str
    re: int | None = None


@message("stats_reply", S2C)
class StatsReply(Message):
    """The answer to stats: the client's GPUs, with only its own instance."""

    re: int
    gpus: list[dict[str, Any]]


Reply = Welcome | Registered | Ok | Denied | Error | StatsReply

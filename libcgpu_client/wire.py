"""The client <-> daemon wire protocol: msgpack maps over a SOCK_STREAM UNIX socket.

Both ends use this module. Every message is one msgpack map with a string
``op``; :data:`MESSAGES` lists every op, its direction and its fields, and
``proto/schema.json`` is the same table for other languages (a test keeps the
two equal). A frame larger than :data:`MAX_MESSAGE` bytes, a frame that is not
a map, or a map that breaks its op's field table is a :class:`ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_MESSAGE = 64 * 1024

# field type names: int, str, bool, list[int], list[str], list[int|str], list[map], map, and "|nil"
Fields = dict[str, tuple[str, bool]]

MESSAGES: dict[str, dict[str, Any]] = {
    # client -> daemon
    "hello": {"dir": "c2s", "reply": "welcome", "fields": {
        "versions": ("list[int]", True), "client": ("str", True), "pid": ("int", False)}},
    "register": {"dir": "c2s", "reply": "registered", "fields": {
        "id": ("int", True), "instance": ("str|nil", True), "gpus": ("list[int|str]", True),
        "weight": ("int", False), "highprio": ("int", False), "memsize": ("list[int]", False),
        "core_percent": ("int", False)}},
    "acquire": {"dir": "c2s", "reply": "grant", "fields": {"id": ("int", True), "gpu": ("int", True)}},
    "release": {"dir": "c2s", "reply": "ok", "fields": {
        "gpu": ("int", True), "lease": ("int", True), "used_ns": ("int", True),
        "again": ("bool", False), "id": ("int", False)}},
    "mem_reserve": {"dir": "c2s", "reply": "ok|denied", "fields": {
        "id": ("int", True), "gpu": ("int", True), "bytes": ("int", True)}},
    "mem_free": {"dir": "c2s", "reply": "ok", "fields": {
        "id": ("int", True), "gpu": ("int", True), "bytes": ("int", True)}},
    "stats": {"dir": "c2s", "reply": "stats", "fields": {"id": ("int", True)}},
    "bye": {"dir": "c2s", "reply": None, "fields": {}},
    # daemon -> client
    "welcome": {"dir": "s2c", "reply": None, "fields": {
        "version": ("int", True), "server": ("str", True), "max_message": ("int", True),
        "clock": ("str", True)}},
    "registered": {"dir": "s2c", "reply": None, "fields": {
        "re": ("int", True), "instance": ("str", True), "gpus": ("list[map]", True),
        "warnings": ("list[str]", True)}},
    "grant": {"dir": "s2c", "reply": None, "fields": {
        "gpu": ("int", True), "lease": ("int", True), "deadline_ns": ("int", True),
        "re": ("int", False)}},
    "revoke": {"dir": "s2c", "reply": None, "fields": {
        "gpu": ("int", True), "lease": ("int", True), "reason": ("str", True)}},
    "ok": {"dir": "s2c", "reply": None, "fields": {
        "re": ("int", True), "used": ("int", False), "limit": ("int", False)}},
    "denied": {"dir": "s2c", "reply": None, "fields": {
        "re": ("int", True), "used": ("int", True), "limit": ("int", True), "reason": ("str", True)}},
    "error": {"dir": "s2c", "reply": None, "fields": {
        "re": ("int|nil", False), "code": ("str", True), "message": ("str", True)}},
}
# "stats" is both a request and its reply; the reply carries "re" and "gpus".
STATS_REPLY: Fields = {"re": ("int", True), "gpus": ("list[map]", True)}
STATS_REQUEST: Fields = {"id": ("int", True)}

ERROR_CODES = ("bad_frame", "too_large", "unknown_op", "bad_request", "version", "identity",
               "refused", "not_found", "busy")


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


Checker = Callable[[Any], bool]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**64


def _compile(tname: str) -> Checker:
    """A function checking one field type name (see the comment above MESSAGES)."""
    if tname.endswith("|nil"):
        inner = _compile(tname[:-4])
        return lambda v: v is None or inner(v)
    if tname == "int":
        return _is_int
    if tname == "str":
        return lambda v: isinstance(v, str)
    if tname == "bool":
        return lambda v: isinstance(v, bool)
    if tname == "map":
        return lambda v: isinstance(v, dict)
    if tname.startswith("list[") and tname.endswith("]"):
        alternatives = [_compile(t) for t in tname[5:-1].split("|")]
        return lambda v: isinstance(v, list) and all(any(c(x) for c in alternatives) for x in v)
    raise ValueError(f"unknown field type {tname}")


@dataclass(frozen=True, slots=True)
class _Table:
    """One op's field table, compiled: a checker per field and the required fields."""

    spec: Fields
    checks: dict[str, Checker]
    required: tuple[str, ...]


def _table(spec: Fields) -> _Table:
    return _Table(spec, {k: _compile(t) for k, (t, _) in spec.items()},
                  tuple(k for k, (_, req) in spec.items() if req))


_TABLES = {op: _table(m["fields"]) for op, m in MESSAGES.items()}
_STATS_TABLES = {"s2c": _table(STATS_REPLY), "c2s": _table(STATS_REQUEST)}


def fields_of(op: str, msg: dict[str, Any], direction: str | None = None) -> Fields:
    return _table_of(op, msg, direction).spec


def _table_of(op: str, msg: dict[str, Any], direction: str | None) -> _Table:
    if op == "stats":
        if direction == "s2c" or (direction is None and "re" in msg):
            return _STATS_TABLES["s2c"]
        return _STATS_TABLES["c2s"]
    return _TABLES[op]


def validate(msg: Any, direction: str | None = None) -> dict[str, Any]:
    """Check ``msg`` against its op's field table; return it or raise ProtocolError."""
    if not isinstance(msg, dict):
        raise ProtocolError("bad_frame", f"expected a map, got {type(msg).__name__}")
    op = msg.get("op")
    if not isinstance(op, str):
        raise ProtocolError("bad_frame", "message has no string 'op'")
    meta = MESSAGES.get(op)
    if meta is None:
        raise ProtocolError("unknown_op", f"unknown op {op[:40]!r}")
    if direction is not None and meta["dir"] != direction and op != "stats":
        raise ProtocolError("unknown_op", f"op {op!r} is not sent in this direction")
    table = _table_of(op, msg, direction)
    checks = table.checks
    for key, value in msg.items():
        check = checks.get(key)
        if check is None:
            if key == "op":
                continue
            raise ProtocolError("bad_request", f"{op}: unexpected field {str(key)[:40]!r}")
        if not check(value):
            raise ProtocolError("bad_request", f"{op}: field {key!r} must be {table.spec[key][0]}")
    for key in table.required:
        if key not in msg:
            raise ProtocolError("bad_request", f"{op}: missing field {key!r}")
    return msg


def encode(msg: dict[str, Any], direction: str | None = None) -> bytes:
    """Validate and pack one message."""
    validate(msg, direction)
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    if len(data) > MAX_MESSAGE:
        raise ProtocolError("too_large", f"message of {len(data)} bytes exceeds {MAX_MESSAGE}")
    return data


def pack(msg: dict[str, Any]) -> bytes:
    """Pack a message known to be valid (hot paths); no validation."""
    data: bytes = msgpack.packb(msg, use_bin_type=True)
    return data


class Decoder:
    """Streaming decoder: feed bytes, iterate messages. Raises ProtocolError on bad input."""

    def __init__(self, direction: str | None = None, max_message: int = MAX_MESSAGE) -> None:
        self.direction = direction
        self.max_message = max_message
        self._unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=True,
            max_buffer_size=2 * max_message,
            max_str_len=max_message,
            max_bin_len=max_message,
            max_array_len=4096,
            max_map_len=64,
            max_ext_len=0,
        )
        self._fed = 0

    def feed(self, data: bytes) -> Iterator[dict[str, Any]]:
        """Feed ``data``; iterate every complete message in it (decoded; :func:`validate` checks one)."""
        return self.feed_raw(data)

    def feed_raw(self, data: bytes) -> Iterator[Any]:
        """Feed ``data`` and return an iterator over every complete frame, decoded but not validated."""
        if len(data) <= self.max_message:  # the usual case: one read, no chunking (a hot path)
            self._feed_chunk(data)
            return self._drain()
        return self._feed_chunks(data)

    def _feed_chunks(self, data: bytes) -> Iterator[Any]:
        view = memoryview(data)
        step = self.max_message
        for start in range(0, len(view), step):
            self._feed_chunk(view[start:start + step])
            yield from self._drain()

    def _feed_chunk(self, chunk: bytes | memoryview) -> None:
        self._fed += len(chunk)
        try:
            self._unpacker.feed(chunk)
        except msgpack.BufferFull:
            raise ProtocolError("too_large", f"frame exceeds {self.max_message} bytes") from None

    def _drain(self) -> Iterator[dict[str, Any]]:
        # iterating the Unpacker ends quietly where the data does (no OutOfData raised per feed)
        try:
            yield from self._unpacker
        except (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError,
                TypeError, UnicodeDecodeError) as exc:
            if "exceeds" in str(exc):
                raise ProtocolError("too_large", f"frame exceeds a limit ({exc})") from None
            raise ProtocolError("bad_frame", f"undecodable frame ({exc.__class__.__name__})") from None
        if self.pending_bytes > self.max_message:
            raise ProtocolError("too_large", f"frame exceeds {self.max_message} bytes")

    @property
    def pending_bytes(self) -> int:
        """Bytes fed that do not yet form a whole message (a frame still arriving)."""
        return int(self._fed - self._unpacker.tell())

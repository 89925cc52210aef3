"""Framing: one msgpack map per message over a SOCK_STREAM socket, bounded in size.

:class:`Decoder` is msgpack's streaming ``Unpacker`` with the protocol's limits;
it yields decoded frames, which :func:`~cgpu_protocol.messages.decode`
turns into messages. Anything malformed is a :class:`ProtocolError` whose code
says how the peer is answered.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import msgpack

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_MESSAGE = 64 * 1024
MAX_MAP_KEYS = 64
MAX_ARRAY_ITEMS = 4096
# what the daemon takes from a client: the largest request is a register naming 64 GPUs by UUID, with a memory
# limit each (about 3.5 KiB, 8 keys); nothing legitimate comes near these, and a frame of them decodes into at
# most a few thousand items
MAX_REQUEST = 8 * 1024
MAX_REQUEST_MAP_KEYS = 16
MAX_REQUEST_ARRAY_ITEMS = 64
ERROR_CODES = ("bad_frame", "too_large", "unknown_op", "bad_request", "version", "identity",
               "refused", "not_found", "busy")


_UNDECODABLE = (msgpack.ExtraData, msgpack.FormatError, msgpack.StackError, ValueError, TypeError,
                UnicodeDecodeError)


class ProtocolError(Exception):
    """The peer sent something the protocol does not allow (``code`` is one of ERROR_CODES)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Encoder:
    """Frames outgoing messages: msgpack's ``Packer``, reused (``msgpack.packb`` builds a new one per call, a large
    part of what framing a small message costs). Not thread-safe: one per connection, or per thread."""

    def __init__(self) -> None:
        self._pack = msgpack.Packer(use_bin_type=True).pack

    def frame(self, fields: dict[str, Any]) -> bytes:
        """One frame (the caller built ``fields`` from a message: no checks here)."""
        data: bytes = self._pack(fields)
        return data


class _Encoders(threading.local):
    def __init__(self) -> None:
        self.encoder = Encoder()


_encoders = _Encoders()


def pack(fields: dict[str, Any]) -> bytes:
    """One frame, with this thread's encoder."""
    return _encoders.encoder.frame(fields)


class Decoder:
    """Streaming decoder: feed bytes, iterate complete frames. Raises ProtocolError on bad input."""

    def __init__(self, max_message: int = MAX_MESSAGE, max_array: int = MAX_ARRAY_ITEMS,
                 max_map: int = MAX_MAP_KEYS) -> None:
        self.max_message = max_message
        self._unpacker = msgpack.Unpacker(
            raw=False,
            strict_map_key=True,
            max_buffer_size=2 * max_message,
            max_str_len=max_message,
            max_bin_len=max_message,
            max_array_len=max_array,
            max_map_len=max_map,
            max_ext_len=0,
        )
        self._fed = 0  # bytes fed in all
        self._whole = 0  # where the last whole frame ended, in the same count

    def feed(self, data: bytes | memoryview) -> Iterable[Any]:
        """Feed ``data``; iterate every complete frame in it, decoded but not yet validated.

        A frame that cannot be decoded raises ProtocolError, after the good frames before it. The usual read
        (the grant path: one whole frame) is decoded here and comes back as a list, with no generator; a read
        longer than a frame may be is fed in pieces of that size, so the buffer's bound stays in force."""
        size = len(data)
        if size > self.max_message:
            return self._feed_chunks(data)
        unpacker = self._unpacker
        self._fed += size
        try:
            unpacker.feed(data)
        except msgpack.BufferFull:
            raise ProtocolError("too_large", f"frame exceeds {self.max_message} bytes") from None
        frames: list[Any] = []
        fed = self._fed
        whole = self._whole  # where the last whole frame ended (the unpacker's own position may be inside the next)
        try:
            # one unpack() per frame while bytes are left, rather than iterating: an iterator ends by
            # raising at the end of the data, and on the grant path (one whole frame per read) that
            # exception cost more than decoding the frame
            while whole < fed:
                frames.append(unpacker.unpack())
                whole = unpacker.tell()
        except msgpack.OutOfData:  # a frame still arriving: the unpacker keeps what it has of it
            pass
        except _UNDECODABLE as exc:
            self._whole = whole
            return itertools.chain(frames, self._fail(exc))
        self._whole = whole
        if fed - whole > self.max_message:
            return itertools.chain(frames, self._fail(None))
        return frames

    def stream(self, data: bytes | memoryview) -> Iterator[Any]:
        """:meth:`feed`, lazily: each frame is decoded only when it is asked for, so a reader that stops early
        (the daemon, when a client's turn is spent) has decoded no more than it handled. Frames of ``data`` are
        only in order after those of an earlier stream that was run to its end."""
        view = memoryview(data)
        unpacker = self._unpacker
        for start in range(0, len(view), self.max_message):
            piece = view[start:start + self.max_message]
            self._fed += len(piece)
            try:
                unpacker.feed(piece)
            except msgpack.BufferFull:
                raise ProtocolError("too_large", f"frame exceeds {self.max_message} bytes") from None
            while self._whole < self._fed:
                try:
                    frame = unpacker.unpack()
                except msgpack.OutOfData:
                    break
                except _UNDECODABLE as exc:
                    yield from self._fail(exc)
                self._whole = unpacker.tell()
                yield frame
            if self._fed - self._whole > self.max_message:
                yield from self._fail(None)

    def _feed_chunks(self, data: bytes | memoryview) -> Iterator[Any]:
        view = memoryview(data)
        step = self.max_message
        for start in range(0, len(view), step):
            yield from self.feed(view[start:start + step])

    def _fail(self, exc: Exception | None) -> Iterator[Any]:
        """Raise the ProtocolError for ``exc`` (None: a frame still arriving is already too large)."""
        if exc is None:
            raise ProtocolError("too_large", f"frame exceeds {self.max_message} bytes")
        if "exceeds" in str(exc):
            raise ProtocolError("too_large", f"frame exceeds a limit ({exc})") from None
        raise ProtocolError("bad_frame", f"undecodable frame ({exc.__class__.__name__})") from None
        yield  # a generator: it raises when iterated, after the frames chained before it

    @classmethod
    def for_requests(cls) -> Decoder:
        """The daemon's decoder of a client's requests: frames no larger than the largest request needs."""
        return cls(MAX_REQUEST, MAX_REQUEST_ARRAY_ITEMS, MAX_REQUEST_MAP_KEYS)

    @property
    def whole(self) -> int:
        """Bytes fed up to the end of the last whole frame decoded (so a frame's size is the step it made)."""
        return self._whole

    @property
    def pending_bytes(self) -> int:
        """Bytes fed that do not yet form a whole message (a frame still arriving).

        Counted from the end of the last whole frame: the unpacker's own position moves into a frame as it
        parses the parts that have arrived (a frame cut after its first key read as nothing pending)."""
        return self._fed - self._whole

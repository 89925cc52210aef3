"""The client <-> daemon protocol: its messages, their framing, and the schema both come from.

Both ends (the daemon, the blocking and the asyncio client) use this package;
``libcgpu.so`` speaks the same messages in C and is tested against it.
"""

from cgpu_protocol.codec import (
    ERROR_CODES,
    MAX_MESSAGE,
    MAX_REQUEST,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Decoder,
    Encoder,
    ProtocolError,
)
from cgpu_protocol.messages import (
    C2S,
    MESSAGES,
    REVOKE_REASONS,
    S2C,
    Acquire,
    Bye,
    Denied,
    Error,
    Grant,
    Hello,
    MemFree,
    MemQuery,
    MemReserve,
    Message,
    Ok,
    Register,
    Registered,
    Release,
    Revoke,
    Stats,
    StatsReply,
    Welcome,
    decode,
    request_id,
)

__all__ = [
    "C2S", "ERROR_CODES", "MAX_MESSAGE", "MAX_REQUEST", "MESSAGES", "PROTOCOL_VERSION", "REVOKE_REASONS", "S2C",
    "SUPPORTED_VERSIONS", "Acquire", "Bye", "Decoder", "Denied", "Encoder", "Error", "Grant", "Hello", "MemFree",
    "MemQuery", "MemReserve", "Message", "Ok", "ProtocolError", "Register", "Registered", "Release", "Revoke",
    "Stats", "StatsReply", "Welcome", "decode", "request_id",
]

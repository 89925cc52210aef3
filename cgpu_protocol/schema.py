"""``proto/schema.json``, generated from the message classes.

    python -m cgpu_protocol.schema > proto/schema.json

A test checks that the committed file is what this prints.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from cgpu_protocol.codec import ERROR_CODES, MAX_ARRAY_ITEMS, MAX_MAP_KEYS, MAX_MESSAGE, PROTOCOL_VERSION
from cgpu_protocol.messages import MESSAGES, REVOKE_REASONS


def schema() -> dict[str, Any]:
    return {
        "protocol": "cgpu",
        "version": PROTOCOL_VERSION,
        "encoding": "msgpack map per message, SOCK_STREAM UNIX socket",
        "max_message_bytes": MAX_MESSAGE,
        "max_map_keys": MAX_MAP_KEYS,
        "max_array_items": MAX_ARRAY_ITEMS,
        "error_codes": list(ERROR_CODES),
        "revoke_reasons": list(REVOKE_REASONS),
        "messages": {
            op: {
                "direction": cls.DIRECTION,
                "reply": cls.REPLY,
                "fields": {name: {"type": f.type, "required": f.required} for name, f in cls.FIELDS.items()},
            }
            for op, cls in MESSAGES.items()
        },
    }


def render() -> str:
    return json.dumps(schema(), indent=2) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())

"""Instance and allocation ids, checked by the one rule every surface shares (cgpu_protocol.names)."""

from __future__ import annotations

from arbiterd.core.errors import SettingError
from cgpu_protocol.names import NAME_RULE, is_name


def valid_instance_id(name: object) -> str:
    """Return ``name`` if it is a valid instance id, else raise SettingError."""
    if not is_name(name):
        raise SettingError(f"invalid instance id {name!r}: use {NAME_RULE}")
    return name  # type: ignore[return-value]


def valid_alloc_id(name: object) -> str:
    """Return ``name`` if it is a valid allocation id, else raise SettingError."""
    if not is_name(name):
        raise SettingError(f"invalid allocation id {name!r}: use {NAME_RULE}")
    return name  # type: ignore[return-value]

"""Parsing of sizes and small values shared by the admin tree and the config."""

from __future__ import annotations

import re

from arbiterd.core.errors import SettingError

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3, "gb": 1000**3,
    "t": 1000**4, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+)\s*([a-zA-Z]*)\s*$")
_INT = re.compile(r"^\s*[+-]?\d+\s*$")

GIB = 1024**3


def parse_size(name: str, text: str) -> int:
    """Parse ``4294967296``, ``4GiB`` or ``512MiB`` into bytes."""
    m = _SIZE.match(text)
    if not m or m.group(2).lower() not in _UNITS:
        raise SettingError(f"{name}: expected a size in bytes (or with KiB/MiB/GiB), got {text.strip()!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_int(name: str, text: str) -> int:
    if not _INT.match(text):
        raise SettingError(f"{name}: expected an integer, got {text.strip()!r}")
    return int(text)


def format_size(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"

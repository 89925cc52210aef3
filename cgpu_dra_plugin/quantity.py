"""Kubernetes resource quantities (``4Gi``, ``30``, ``500m``, ``1e3``) as the integers the plugin works in.

Only what ResourceSlices and ResourceClaims carry for ``memory`` (bytes) and ``cores`` (percent):
a quantity that is not a whole number is rounded up, as the API server's ``Value()`` does.
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_SUFFIX: dict[str, int | Decimal] = {
    "": 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6, "G": 10**9,
    "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^(?P<num>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?P<suf>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|"
                       r"[eE][+-]?[0-9]+)?$")
GIB = 2**30


class BadQuantity(ValueError):
    """Text that is not a Kubernetes quantity."""


def parse(text: object) -> int:
    """``"4Gi"`` -> 4294967296, ``"30"`` -> 30; a fraction rounds up; raise BadQuantity for anything else."""
    if isinstance(text, bool):
        raise BadQuantity(f"{text!r} is not a quantity")
    if isinstance(text, int):
        return text
    m = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise BadQuantity(f"{text!r} is not a quantity (like 4Gi, 30 or 500m)")
    suf = m.group("suf") or ""
    try:
        num = Decimal(str(m.group("num")))
        value = num * Decimal(10) ** int(suf[1:]) if suf[:1] in ("e", "E") else num * Decimal(_SUFFIX[suf])
    except (InvalidOperation, ValueError) as exc:
        raise BadQuantity(f"{text!r} is not a quantity: {exc}") from None
    return int(value.to_integral_value(rounding=ROUND_CEILING))


def gib(n: int) -> str:
    """Bytes as a quantity: whole GiB as ``4Gi``, anything else as plain bytes."""
    return f"{n // GIB}Gi" if n % GIB == 0 else str(n)

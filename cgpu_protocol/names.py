"""What a name is, on every surface: an instance id (``register``, ``CGPU_INSTANCE``, the settings tree,
``inst_ctl``, the state file) and an allocation id follow one rule, matched in full.

1 to 128 characters of ``A-Z a-z 0-9 _ . -``, not starting with ``. - _``: no control characters (a trailing
newline included), no path separators, nothing a shell or a log line would read differently.
"""

from __future__ import annotations

import re

NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
NAME_RULE = "1-128 of A-Z a-z 0-9 _ . - (not starting with . - _)"


def is_name(text: object) -> bool:
    """Whether ``text`` is a valid instance or allocation id, matched in full."""
    return isinstance(text, str) and NAME.fullmatch(text) is not None

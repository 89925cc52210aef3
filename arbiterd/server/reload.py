"""SIGHUP: re-read the config file and apply what changed, keeping the flags the daemon started with."""

from __future__ import annotations

import logging
import time
from typing import Any

from arbiterd.core.errors import CoreError
from arbiterd.server import config as config_mod
from arbiterd.server import limits
from arbiterd.server.config import OPTIONS
from arbiterd.server.hub import Hub

log = logging.getLogger("arbiterd")


def reload(hub: Hub, flags: dict[str, Any]) -> bool:
    """Apply the config file again (flags still win). A bad file changes nothing; returns whether it applied."""
    old = hub.config
    if old.source is None:
        log.info("reload: no config file; nothing to do")
        return True
    try:
        new = config_mod.load(old.source, flags)
    except CoreError as exc:
        log.error("reload refused, keeping the running config: %s", exc)
        return False
    short = limits.shortfall(new)
    if short is not None:
        log.error("reload refused, keeping the running config: %s", short)
        return False
    for name, s in OPTIONS.items():
        if s.restart and getattr(new, name) != getattr(old, name):
            log.warning("reload: %s changed; it takes effect at the next restart", name)
            setattr(new, name, getattr(old, name))
    hub.retune(old, new, time.monotonic_ns())
    logging.getLogger().setLevel(new.log_level.upper())
    log.info("reload: configuration re-read from %s", old.source)
    return True

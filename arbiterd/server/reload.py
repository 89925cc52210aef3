"""SIGHUP: re-read the config file and apply what changed, keeping the flags the daemon started with."""

from __future__ import annotations

import logging
import time
from typing import Any

from arbiterd.core.effects import Effect
from arbiterd.core.errors import CoreError
from arbiterd.core.settings import GPU
from arbiterd.server import config as config_mod
from arbiterd.server.config import OPTIONS, Config
from arbiterd.server.hub import Hub, arbiter_config
from arbiterd.server.identity import IdentityResolver

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
    now = time.monotonic_ns()
    for name, s in OPTIONS.items():
        if s.restart and getattr(new, name) != getattr(old, name):
            log.warning("reload: %s changed; it takes effect at the next restart", name)
            setattr(new, name, getattr(old, name))
    effects: list[Effect] = []
    for name in GPU:
        before, after = getattr(old.gpu, name), getattr(new.gpu, name)
        if after == before:
            continue
        for gpu, sched in hub.arbiter.scheds.items():
            try:
                effects += sched.set(name, after, now)
            except CoreError as exc:
                log.error("reload: GPU %d: %s", gpu, exc)
        log.info("reload: %s %s -> %s", name, GPU[name].format(before), GPU[name].format(after))
    _apply_options(hub, old, new)
    hub.config = new
    hub.apply(effects)
    log.info("reload: configuration re-read from %s", old.source)
    return True


def _apply_options(hub: Hub, old: Config, new: Config) -> None:
    acfg = hub.arbiter.config
    fresh = arbiter_config(new)
    for name in ("trust_client_env", "linger_ns", "allocations", "overcommit", "clients_shape_gpus",
                 "max_records_per_uid"):
        setattr(acfg, name, getattr(fresh, name))
    if new.default_memsize != old.default_memsize:
        hub.arbiter.set_global("default_memsize", config_mod.default_memsize(new))
    hub.identity = IdentityResolver(new.identity, new.proc_root, new.host_clients)
    logging.getLogger().setLevel(new.log_level.upper())

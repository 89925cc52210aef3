"""The daemon's file descriptors: enough for every connection it may hold, checked before it serves.

Each client connection, admin connection and pidfd is a descriptor. If the
process's limit (``RLIMIT_NOFILE``; systemd's default soft limit is 1024) is
below what ``max_clients`` and the admin connections need, tenants would lock
each other out well before ``max_clients``, and ``accept`` on ``admin.sock``
would fail with ``EMFILE``, root's ``cgpuctl`` included. So at start, and at a
reload that changes the options, the daemon needs

    max_clients + 2 x max_admin_clients + RESERVED

descriptors: the client connections; the loopback TCP listener's connections
and as many refused ``admin.sock`` peers (adminconn.py); and ``RESERVED`` for
its own files (sockets, state, logs, NVML, the freezers, a pidfd while a peer
is read) and root's ``admin.sock`` connections, which no cap counts. The soft
limit is raised to that where the hard limit allows (as systemd advises
programs that need more); where it does not, the daemon does not start, with
one line saying what to change. The shipped unit sets ``LimitNOFILE``.
"""

from __future__ import annotations

import logging
import resource

from arbiterd.server.config import Config

log = logging.getLogger("arbiterd")
RESERVED = 256


def needed(cfg: Config) -> int:
    """The descriptors ``cfg`` may need at once."""
    return cfg.max_clients + 2 * cfg.max_admin_clients + RESERVED


def shortfall(cfg: Config) -> str | None:
    """Make the soft descriptor limit fit ``cfg`` where the hard one allows; else one line saying what to change."""
    need = needed(cfg)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (f"max_clients {cfg.max_clients} and max_admin_clients {cfg.max_admin_clients} need {need} file "
                f"descriptors, and the limit is {hard}: raise LimitNOFILE (ulimit -n) to {need} or more, or lower "
                f"max_clients")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    log.info("file descriptor limit raised from %d to %d (max_clients %d, max_admin_clients %d)", soft, need,
             cfg.max_clients, cfg.max_admin_clients)
    return None

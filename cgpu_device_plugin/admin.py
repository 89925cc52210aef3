"""arbiterd's admin API as the plugin reads it: arbiterd's own admin client, with the status as a NodeView."""

from __future__ import annotations

from dataclasses import dataclass

from arbiterd.tools.adminclient import ALLOC_CTL, Refused, Unreachable
from arbiterd.tools.adminclient import AdminClient as _AdminClient
from cgpu_device_plugin.node import NodeView, parse_status

__all__ = ["ALLOC_CTL", "AdminClient", "Refused", "Unreachable"]


@dataclass
class AdminClient(_AdminClient):
    """Over ``admin.sock``, a request waiting at most ``timeout`` s (a handful of them per Allocate)."""

    timeout: float = 5.0

    def node(self) -> NodeView:
        """The live node; raise Unreachable, or StatusError when the daemon lacks allocation support."""
        return parse_status(self.status())

"""The plugin as one object: builds the parts, starts them in order and stops them in reverse."""

from __future__ import annotations

import logging
import os
import threading

from cgpu_device_plugin import podlimits
from cgpu_device_plugin.admin import AdminClient
from cgpu_device_plugin.allocator import Allocator
from cgpu_device_plugin.config import IN_CLUSTER, NODE_NAME_ENV, Config
from cgpu_device_plugin.devices import Resource
from cgpu_device_plugin.health import NodeMonitor
from cgpu_device_plugin.kubelet import KubeletLink
from cgpu_device_plugin.podlimits import PodLimits
from cgpu_device_plugin.podresources import PodLabeller
from cgpu_device_plugin.servicer import DevicePluginServicer
from cgpu_device_plugin.store import AllocationStore

log = logging.getLogger("cgpu_device_plugin")


class Plugin:
    """``start()`` returns once every part runs; ``stop()`` stops serving, then polling."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.admin = AdminClient(cfg.admin_socket)
        self.store = AllocationStore(cfg.alloc_dir)
        self.allocator = Allocator(cfg, self.admin, self.store)
        self.monitor = NodeMonitor(self.admin, cfg.poll_interval_s, on_back=self.allocator.resync)
        self.allocator.on_unreachable = self.monitor.poke
        self.stopping = threading.Event()
        self.servicers = {r: DevicePluginServicer(r, self.allocator, self.monitor, self.stopping) for r in Resource}
        self.link = KubeletLink(cfg, self.servicers)
        self.limits = self._pod_limits(cfg)
        self.labeller = PodLabeller(cfg.pod_resources_socket, cfg.poll_interval_s, self.allocator.label,
                                    then=self.limits.poll_once if self.limits else None)
        self._link_thread: threading.Thread | None = None

    def _pod_limits(self, cfg: Config) -> PodLimits | None:
        """The reader of this node's pods' limits; None without a node name (logged)."""
        node = os.environ.get("NODE_NAME", "") if cfg.node_name == NODE_NAME_ENV else cfg.node_name
        if not node:
            log.info("no node name (--node-name, or NODE_NAME): %s annotations are not read, and a core "
                     "percentage is its container's cap", podlimits.ANNOTATION)
            return None
        from cgpu_dra_plugin.kubeapi import api_client  # the kubernetes client, only where limits are read

        try:
            client = api_client(None, None if cfg.kube_server == IN_CLUSTER else cfg.kube_server)
        except Exception as exc:  # no service account and no kubeconfig
            log.warning("no API server to read %s annotations from (%s): a core percentage is its container's "
                        "cap", podlimits.ANNOTATION, exc)
            return None
        return PodLimits(podlimits.node_pods(client, node), self.allocator.limit)

    def start(self) -> None:
        """Load the records, poll arbiterd, serve and register (raises OSError if alloc_dir is unusable)."""
        self.store.load()
        self.allocator.recover()
        self.monitor.start()
        self.labeller.start()
        self._link_thread = threading.Thread(target=self.link.run, args=(self.stopping,), name="cgpu-kubelet",
                                             daemon=True)
        self._link_thread.start()
        log.info("cgpu-device-plugin started: kubelet dir %s, arbiterd %s, placement %s", self.cfg.kubelet_dir,
                 self.cfg.admin_socket, self.cfg.placement)

    def stop(self) -> None:
        self.stopping.set()
        self.monitor.wake_watchers()
        if self._link_thread is not None:
            self._link_thread.join(15)
        self.labeller.stop()
        self.monitor.stop()
        log.info("cgpu-device-plugin stopped")

"""The DRA plugin as one object: builds the parts, starts them in order and stops them in reverse."""

from __future__ import annotations

import logging

from cgpu_device_plugin.admin import AdminClient
from cgpu_dra_plugin.checkpoint import Checkpoint
from cgpu_dra_plugin.config import Config
from cgpu_dra_plugin.kubeapi import KubeApi, api_client
from cgpu_dra_plugin.prepare import Preparer
from cgpu_dra_plugin.publisher import Publisher
from cgpu_dra_plugin.server import Servers

log = logging.getLogger("cgpu_dra_plugin")


class Plugin:
    """``start()`` returns once it serves; ``stop()`` stops serving, then polling. The slice stays published
    (a restarting plugin must not make the node's GPUs vanish from the scheduler)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.admin = AdminClient(cfg.admin_socket)
        self.kube = KubeApi(api_client(cfg.kubeconfig, cfg.server))
        self.checkpoint = Checkpoint(cfg.state_dir)
        self.preparer = Preparer(cfg, self.admin, self.kube, self.checkpoint)
        self.publisher = Publisher(cfg, self.admin, self.kube, self.preparer)
        self.servers = Servers(cfg, self.preparer)

    def start(self) -> None:
        """Load the checkpoint, poll arbiterd (its first poll resyncs: :meth:`Preparer.resync`) and publish,
        serve (raises OSError if a directory is unusable)."""
        self.checkpoint.load()
        self.publisher.start()
        self.servers.start()
        log.info("cgpu-dra-plugin started: driver %s on node %s, %d prepared claim(s), arbiterd %s",
                 self.cfg.driver, self.cfg.node_name, len(self.checkpoint.claims), self.cfg.admin_socket)

    def stop(self) -> None:
        self.servers.stop()
        self.publisher.stop()
        self.kube.api_client.close()
        log.info("cgpu-dra-plugin stopped")

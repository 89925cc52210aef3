"""Keeps the node's ResourceSlice equal to arbiterd's cards, and arbiterd equal to the checkpoint.

One thread polls arbiterd's status every ``poll_interval_s``:

* the cards (and each card's policy) become the slice (:mod:`slices`); it is written only when
  it changed, with the pool's generation one higher than the slice on the API server, so a
  card that appears, disappears or changes policy reaches the scheduler at the next poll;
* when arbiterd answers after it did not (started, restarted, upgraded) the preparer resyncs
  the allocations from the checkpoint;
* every ``gc_interval_s`` prepared claims gone from the API server are unprepared.

While arbiterd does not answer the slice stays as it was: pods already running keep their
claims, and a new claim's prepare fails (and the kubelet retries) until arbiterd is back.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from cgpu_device_plugin.admin import AdminClient, Unreachable
from cgpu_device_plugin.node import StatusError, parse_status
from cgpu_dra_plugin.config import Config
from cgpu_dra_plugin.kubeapi import ApiException, KubeApi
from cgpu_dra_plugin.prepare import Preparer
from cgpu_dra_plugin.slices import Gpu, gpus_of, resource_slice, slice_name

log = logging.getLogger("cgpu_dra_plugin.publisher")


class Publisher:
    def __init__(self, cfg: Config, admin: AdminClient, kube: KubeApi, preparer: Preparer) -> None:
        self.cfg = cfg
        self.admin = admin
        self.kube = kube
        self.preparer = preparer
        self.published: list[Gpu] | None = None
        self.generation = 0
        self.slices_written = 0
        self._daemon_pid: int | None = None
        self._last_gc = 0.0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cgpu-dra-publisher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(10)

    def poke(self) -> None:
        """Poll now rather than at the next interval."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step(time.monotonic())
            except Exception:  # a bug must not stop the slice's updates: say it, and poll again
                log.exception("publishing the ResourceSlice failed; trying again at the next poll")
            self._wake.wait(self.cfg.poll_interval_s)
            self._wake.clear()

    def step(self, now: float) -> None:
        """One poll: arbiterd, the slice, and (when due) the garbage collection; every failure is logged."""
        try:
            status = self.admin.status()
            node = parse_status(status)
        except (Unreachable, StatusError) as exc:
            if self._daemon_pid is not None:
                log.warning("arbiterd does not answer (%s); the slice stays, prepares fail until it is back", exc)
            self._daemon_pid = None
            return
        try:
            if node.pid != self._daemon_pid:
                self._daemon_pid = self.preparer.resync()  # reads arbiterd again, under the preparer's lock
            self.publish(gpus_of(status))
            if now - self._last_gc >= self.cfg.gc_interval_s:
                self._last_gc = now
                for uid in self.preparer.collect_garbage():
                    log.info("claim %s: unprepared, its claim is gone", uid)
        except (Unreachable, StatusError) as exc:
            log.warning("arbiterd went away during a resync (%s); trying again at the next poll", exc)
            self._daemon_pid = None
        except (ApiException, OSError, ValueError) as exc:
            log.error("the API server: %s; trying again at the next poll", exc)

    def publish(self, gpus: list[Gpu]) -> bool:
        """Write the slice if ``gpus`` differ from what was published; whether it was written."""
        if gpus == self.published:
            return False
        name = slice_name(self.cfg.node_name, self.cfg.driver)
        if self.published is None:  # first publish of this process: continue the pool's generations
            for s in self.kube.list_slices(self.cfg.driver):
                if s.get("metadata", {}).get("name") == name:
                    self.generation = int(s["spec"]["pool"]["generation"])
                    if s["spec"].get("devices") == resource_slice(self.cfg.node_name, self.cfg.driver, gpus,
                                                                  0)["spec"]["devices"]:
                        self.published = gpus
                        return False
        body: dict[str, Any] = resource_slice(self.cfg.node_name, self.cfg.driver, gpus, self.generation + 1)
        self.kube.apply_slice(body)
        self.generation += 1
        self.slices_written += 1
        log.info("ResourceSlice %s: generation %d, %s", name, self.generation,
                 ", ".join(f"GPU {g.index} {g.gib} GiB policy {g.policy}" for g in gpus) or "no GPU")
        self.published = gpus
        return True

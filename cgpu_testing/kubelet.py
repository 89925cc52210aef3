"""A fake kubelet: a real gRPC ``Registration`` server that drives device plugins in the kubelet's order.

What it does, as the kubelet's device manager does (pkg/kubelet/cm/devicemanager):

* ``Register`` (on ``<dir>/kubelet.sock``): checks the version, dials the plugin's socket,
  calls ``GetDevicePluginOptions`` *before* answering, then keeps a ``ListAndWatch`` stream
  open in a thread and records every device list it receives.
* ``admit(pod)``: for each container, for each resource it asks for (in random order, as
  Go's map iteration gives): available = healthy devices minus those in use; if the plugin
  says so, ``GetPreferredAllocation`` (available, must-include none, size); the preferred
  IDs first, then others in random order; the IDs count as in use *before* ``Allocate``;
  ``Allocate``; ``PreStartContainer`` if the plugin requires it. Any failure fails the
  pod's admission (``AdmissionError``) and frees what it held.
* ``delete(pod)`` frees the pod's devices (the kubelet does it lazily, at the next
  admission: the plugin cannot tell the difference) and kills its containers.
* ``restart()`` stops, empties the directory (the kubelet deletes every plugin socket when
  it starts) and serves a new ``kubelet.sock``; devices in use survive (its checkpoint).
* the PodResources API (``v1.PodResourcesLister``, :mod:`cgpu_testing.podresources`) on
  ``<root>/pod-resources/kubelet.sock``, as the kubelet serves it on
  ``/var/lib/kubelet/pod-resources/kubelet.sock``: each admitted pod's namespace, name, and
  per container the device IDs it holds.
* ``start_container`` runs a real process as a "container": the env of the Allocate answers
  (first answer wins on a conflict, as the kubelet merges them), the mounts materialised
  under a rootfs dir (plain directories copied, so that a daemon resolving paths inside the
  container's root finds no symlink; socket directories and files as symlinks), and a fake
  ``/proc/<pid>`` (``cgroup`` with a kubepods path, ``root`` -> the rootfs) written before
  the process is let go: it waits on stdin, then execs. The entry goes when its pod is deleted.

Tests (tests/k8s) and bench.k8s drive it, beside a real arbiterd (:mod:`cgpu_testing.k8s`).
"""

from __future__ import annotations

import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2 as pb
from cgpu_device_plugin.api.deviceplugin.v1beta1 import api_pb2_grpc as pb_grpc
from cgpu_testing.containers import fake_cgroup
from cgpu_testing.podresources import FakePodResources

MEM = "aliyun.com/gpu-mem"
CORE = "aliyun.com/gpu-core.percentage"
HEALTHY = "Healthy"
CHECKPOINT = "kubelet_internal_checkpoint"
WAIT_THEN_EXEC = "import os, sys; sys.stdin.readline(); os.execvp(sys.argv[1], sys.argv[1:])"


class AdmissionError(Exception):
    """The pod failed admission (UnexpectedAdmissionError in a real kubelet); the message says why."""


@dataclass
class Endpoint:
    resource: str
    socket: Path
    channel: grpc.Channel
    stub: pb_grpc.DevicePluginStub
    options: pb.DevicePluginOptions
    devices: dict[str, str] = field(default_factory=dict)
    updates: int = 0
    streaming: bool = False
    call: object = None

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()  # type: ignore[attr-defined]
        self.channel.close()


@dataclass
class Container:
    name: str
    requests: dict[str, int]
    devices: dict[str, list[str]] = field(default_factory=dict)
    responses: dict[str, pb.ContainerAllocateResponse] = field(default_factory=dict)

    def envs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for resp in self.responses.values():
            for k, v in resp.envs.items():
                out.setdefault(k, v)
        return out

    def mounts(self) -> list[pb.Mount]:
        seen: dict[str, pb.Mount] = {}
        for resp in self.responses.values():
            for m in resp.mounts:
                seen.setdefault(m.container_path, m)
        return list(seen.values())


@dataclass
class Pod:
    uid: str
    name: str
    containers: list[Container] = field(default_factory=list)
    namespace: str = "default"

    def container(self, name: str = "c0") -> Container:
        return next(c for c in self.containers if c.name == name)

    @property
    def resources(self) -> list[tuple[str, dict[str, list[str]]]]:
        """Per container, its name and the device IDs it holds by resource (what PodResources reports)."""
        return [(c.name, {r: list(ids) for r, ids in c.devices.items()}) for c in list(self.containers)]


@dataclass
class RunningContainer:
    pod: Pod
    container: Container
    cid: str  # 64 hex
    proc: subprocess.Popen[str]
    rootfs: Path

    def wait(self, timeout: float = 30) -> tuple[int, str, str]:
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out, err


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: FakeKubelet) -> None:
        self.kubelet = kubelet

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Empty:
        self.kubelet.calls.append(("Register", request.resource_name))
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported version {request.version!r}")
        if "/" not in request.resource_name:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{request.resource_name!r} is not an extended resource")
        try:
            self.kubelet._connect(request)
        except grpc.RpcError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach the plugin: {exc}")
        return pb.Empty()


class FakeKubelet:
    def __init__(self, plugin_dir: Path, root: Path, seed: int = 0, shuffle: bool = True,
                 use_preferred: bool = True, proc_root: Path | None = None) -> None:
        self.dir = Path(plugin_dir)
        self.root = Path(root)  # rootfs dirs live here, and the fake /proc unless ``proc_root`` says where
        self.proc_root = Path(proc_root) if proc_root is not None else self.root / "proc"
        self.rng = random.Random(seed)
        self.shuffle = shuffle
        self.use_preferred = use_preferred  # False: as a kubelet older than 1.19, or one that ignores it
        self.endpoints: dict[str, Endpoint] = {}
        self.registrations: dict[str, int] = {}
        self.pods: dict[str, Pod] = {}
        self.running: list[RunningContainer] = []
        self.calls: list[tuple[str, str]] = []  # (rpc, resource) in the order they happened
        self.allocate_seconds: list[float] = []
        self.cond = threading.Condition()
        self._server: grpc.Server | None = None
        self.pod_resources = FakePodResources(self.root / "pod-resources" / "kubelet.sock",
                                              lambda: list(self.pods.values()), self._allocatable)

    @property
    def socket(self) -> Path:
        return self.dir / "kubelet.sock"

    # ------------------------------------------------------------ lifecycle
    def start(self) -> FakeKubelet:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc_root.mkdir(parents=True, exist_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)  # type: ignore[no-untyped-call]
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self.pod_resources.start()
        return self

    def _allocatable(self) -> dict[str, list[str]]:
        with self.cond:
            return {r: [i for i, h in ep.devices.items() if h == HEALTHY] for r, ep in self.endpoints.items()}

    def stop(self) -> None:
        self.pod_resources.stop()
        if self._server is not None:
            self._server.stop(0).wait(5)
            self._server = None
        with self.cond:
            for ep in self.endpoints.values():
                ep.close()
            self.endpoints.clear()
            self.cond.notify_all()
        self.socket.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, delete every socket in the directory (as a starting kubelet does), serve again."""
        self.stop()
        for p in self.dir.iterdir():
            if p.name != CHECKPOINT:
                p.unlink()
        self.start()

    def close(self) -> None:
        for pod in list(self.pods.values()):
            self.delete(pod)
        self.stop()

    # ------------------------------------------------------------ registration and ListAndWatch
    def _connect(self, request: pb.RegisterRequest) -> None:
        path = self.dir / request.endpoint
        channel = grpc.insecure_channel(f"unix://{path}")
        grpc.channel_ready_future(channel).result(timeout=5)
        stub = pb_grpc.DevicePluginStub(channel)  # type: ignore[no-untyped-call]
        self.calls.append(("GetDevicePluginOptions", request.resource_name))
        options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        ep = Endpoint(request.resource_name, path, channel, stub, options)
        with self.cond:
            old = self.endpoints.pop(request.resource_name, None)
            if old is not None:
                old.close()
            self.endpoints[request.resource_name] = ep
            self.registrations[request.resource_name] = self.registrations.get(request.resource_name, 0) + 1
            self.cond.notify_all()
        threading.Thread(target=self._watch, args=(ep,), daemon=True).start()

    def _watch(self, ep: Endpoint) -> None:
        self.calls.append(("ListAndWatch", ep.resource))
        ep.call = call = ep.stub.ListAndWatch(pb.Empty())
        ep.streaming = True
        try:
            for resp in call:
                with self.cond:
                    ep.devices = {d.ID: d.health for d in resp.devices}
                    ep.updates += 1
                    self.cond.notify_all()
        except grpc.RpcError:
            pass  # the stream ended: the plugin stopped, or this kubelet closed the endpoint
        finally:
            with self.cond:
                ep.streaming = False
                self.cond.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
        with self.cond:
            if not self.cond.wait_for(predicate, timeout):
                raise TimeoutError(f"fake kubelet: timed out waiting for {what}")

    def wait_registered(self, resource: str, count: int = 1, timeout: float = 10.0) -> Endpoint:
        self.wait_for(lambda: self.registrations.get(resource, 0) >= count and resource in self.endpoints
                      and self.endpoints[resource].updates > 0, timeout, f"{resource} registration #{count}")
        return self.endpoints[resource]

    def devices(self, resource: str) -> dict[str, str]:
        with self.cond:
            ep = self.endpoints.get(resource)
            return dict(ep.devices) if ep else {}

    def wait_devices(self, resource: str, predicate: Callable[[dict[str, str]], bool], timeout: float = 10.0,
                     what: str = "device list") -> dict[str, str]:
        def ok() -> bool:
            ep = self.endpoints.get(resource)
            return ep is not None and ep.updates > 0 and predicate(ep.devices)

        self.wait_for(ok, timeout, f"{resource} {what}")
        return self.devices(resource)

    # ------------------------------------------------------------ pods
    def in_use(self, resource: str) -> set[str]:
        return {d for p in self.pods.values() for c in p.containers for d in c.devices.get(resource, [])}

    def admit(self, name: str, containers: Sequence[Mapping[str, int]], namespace: str = "default") -> Pod:
        """Admit a pod whose containers ask for these resources; raise AdmissionError on failure."""
        pod = Pod(str(uuid.UUID(int=self.rng.getrandbits(128))), name, namespace=namespace)
        self.pods[pod.uid] = pod
        try:
            for i, requests in enumerate(containers):
                c = Container(f"c{i}", dict(requests))
                pod.containers.append(c)
                order = list(requests)
                if self.shuffle:
                    self.rng.shuffle(order)
                for resource in order:
                    if requests[resource] > 0:
                        self._allocate(c, resource, requests[resource])
        except AdmissionError:
            self.delete(pod)
            raise
        return pod

    def _allocate(self, c: Container, resource: str, n: int) -> None:
        with self.cond:
            ep = self.endpoints.get(resource)
            if ep is None:
                raise AdmissionError(f"{resource}: no device plugin is registered")
            available = {i for i, h in ep.devices.items() if h == HEALTHY} - self.in_use(resource)
        if len(available) < n:
            raise AdmissionError(f"requested number of devices unavailable for {resource}. "
                                 f"Requested: {n}, Available: {len(available)}")
        chosen: list[str] = []
        try:
            if ep.options.get_preferred_allocation_available and self.use_preferred:
                self.calls.append(("GetPreferredAllocation", resource))
                resp = ep.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=sorted(available),
                                                           allocation_size=n)]), timeout=10)
                for d in resp.container_responses[0].deviceIDs:
                    if d in available and d not in chosen and len(chosen) < n:
                        chosen.append(d)
            rest = sorted(available - set(chosen))
            self.rng.shuffle(rest)
            chosen += rest[:n - len(chosen)]
            c.devices[resource] = chosen  # in use before the RPC, as in the kubelet
            self.calls.append(("Allocate", resource))
            t0 = time.perf_counter()
            answer = ep.stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=chosen)]), timeout=10)
            self.allocate_seconds.append(time.perf_counter() - t0)
            c.responses[resource] = answer.container_responses[0]
            if ep.options.pre_start_required:
                self.calls.append(("PreStartContainer", resource))
                ep.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=chosen), timeout=10)
        except grpc.RpcError as exc:
            c.devices.pop(resource, None)
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise AdmissionError(f"{resource}: Allocate failed due to rpc error: {details}") from None

    def delete(self, pod: Pod) -> None:
        for rc in [r for r in self.running if r.pod is pod]:
            if rc.proc.poll() is None:
                rc.proc.send_signal(signal.SIGKILL)
                rc.proc.wait()
            self.running.remove(rc)
            shutil.rmtree(self.proc_root / str(rc.proc.pid), ignore_errors=True)
        with self.cond:
            self.pods.pop(pod.uid, None)

    # ------------------------------------------------------------ containers
    def start_container(self, pod: Pod, argv: Sequence[str], container: str = "c0",
                        env: Mapping[str, str] | None = None, preload: bool = False,
                        extra_mounts: Sequence[tuple[str, str]] = (),
                        symlinks: Sequence[tuple[str, str]] = ()) -> RunningContainer:
        """Run ``argv`` as container ``container`` of ``pod`` (see the module docstring).

        ``extra_mounts`` (container path, host path) adds mounts no plugin asked for: a container
        that got hold of another one's allocation directory. ``symlinks`` (path in the container,
        target) are links the container made itself, e.g. pointing at a host path. Both are for
        the tests that such containers are refused.
        """
        c = pod.container(container)
        cid = secrets.token_hex(32)
        rootfs = self.root / "rootfs" / cid[:12]
        rootfs.mkdir(parents=True)
        mounts = c.mounts() + [pb.Mount(container_path=cp, host_path=hp, read_only=True) for cp, hp in extra_mounts]
        for m in mounts:
            target = rootfs / m.container_path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            host = Path(m.host_path)
            if host.is_dir() and not any(p.is_socket() for p in host.iterdir()):
                shutil.copytree(host, target)  # a plain directory, as a bind mount looks from inside
            else:
                target.symlink_to(host)  # sockets cannot be copied; files need not be
        for link, points_to in symlinks:
            (rootfs / link.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / link.lstrip("/")).symlink_to(points_to)
        envs = c.envs()
        for key in ("CGPU_SOCKET", "LD_PRELOAD"):  # this "container" has no mount namespace: see via rootfs
            if key in envs and any(envs[key].startswith(m.container_path) for m in mounts):
                envs[key] = str(rootfs) + envs[key]
        if not preload:
            envs.pop("LD_PRELOAD", None)  # test programs speak the protocol themselves
        proc = subprocess.Popen([sys.executable, "-c", WAIT_THEN_EXEC, *argv], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **envs, **(env or {})})
        fake_cgroup(self.proc_root, proc.pid, f"/kubepods.slice/kubepods-pod{pod.uid.replace('-', '_')}.slice/"
                                              f"cri-containerd-{cid}.scope")
        (self.proc_root / str(proc.pid) / "root").symlink_to(rootfs)
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
        proc.stdin = None  # let go: communicate() must not touch it again
        rc = RunningContainer(pod, c, cid, proc, rootfs)
        self.running.append(rc)
        return rc

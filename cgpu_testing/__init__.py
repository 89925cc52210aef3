"""The harness that tests, benchmarks and the demo share; run from the checkout, never installed.

* :mod:`~cgpu_testing.tools`: the checkout's root and the console scripts beside this Python (``tool``).
* :mod:`~cgpu_testing.daemon`: ``DaemonProc``, the one way to start ``arbiterd`` (run and state dirs, flags,
  env, a wrapper command, its log, ``cgpuctl``/``cgpu-smi`` and the admin API against it, restarts).
* :mod:`~cgpu_testing.containers`: container cgroups, real or in a fake ``/proc`` (``Containers``,
  ``fake_cgroup``); :mod:`~cgpu_testing.cast`: tenants and attackers as processes (``Agent``, ``Cast``);
  :mod:`~cgpu_testing.agent`: the program an ``Agent`` runs.
* :mod:`~cgpu_testing.kubelet`: the fake kubelet (with :mod:`~cgpu_testing.podresources`, its PodResources
  API); :mod:`~cgpu_testing.k8s`: a node of it, a real arbiterd handing out allocations, and the device plugin.
  :mod:`~cgpu_testing.apiserver`, :mod:`~cgpu_testing.drakubelet`, :mod:`~cgpu_testing.drasched` and
  :mod:`~cgpu_testing.dra`: the same for DRA. :mod:`~cgpu_testing.manifests`: deploy/kubernetes rendered by
  ``kubectl kustomize`` and validated (``crds/``: the PodMonitor's CRD).
* :mod:`~cgpu_testing.spin`: a client that busy-spins "GPU operations" through the slice gate.
* ``native/``: the fake CUDA driver and NVML and the CUDA job program (C), and their build.
"""

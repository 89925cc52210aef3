"""bench.fw_worker's other workloads, each a loader (imports, no CUDA) that returns its builder (on the GPU):

- ``jax``: a jitted chain of eight 4096x4096 float32 matrix products with tanh, in GFLOP. JAX runs on the CUDA
  platform (``JAX_PLATFORMS=cuda``: no silent fall-back to the CPU) and preallocates, its default
  (``XLA_PYTHON_CLIENT_PREALLOCATE=true``, bench.gpu sets it: 75 % of the total it is shown unless
  ``XLA_PYTHON_CLIENT_MEM_FRACTION`` says otherwise); it reports the pool it took (``memory_stats()["bytes_limit"]``);
- ``cupy``: a CuPy ``RawKernel`` (compiled by NVRTC) launched 20 times a step over 4 Mi floats, in kernels;
- ``sleep``: no GPU at all, a 2 ms sleep a step: the protocol's own test.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from bench.fw_worker import Built, Variant

MATMULS = 8
N = 4096
LAUNCHES = 20
BURN = r"""
extern "C" __global__ void burn(float *x, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float v = x[i];
        for (int k = 0; k < iters; k++)
            v = v * 1.0000001f + 0.0000001f;
        x[i] = v;
    }
}
"""


def jax_loop(args: argparse.Namespace) -> Callable[[], Built]:
    os.environ.setdefault("JAX_PLATFORMS", "cuda")
    import jax
    import jax.numpy as jnp

    def build() -> Built:
        dev = jax.devices()[0]
        if dev.platform not in ("gpu", "cuda"):
            raise SystemExit(f"fw_worker jax: JAX runs on {dev.platform}, not on the GPU")
        k1, k2 = jax.random.split(jax.random.PRNGKey(0))
        x = jax.random.normal(k1, (N, N), jnp.float32)
        w = jax.random.normal(k2, (N, N), jnp.float32) / 64

        def products(x: Any, w: Any) -> Any:
            for _ in range(MATMULS):
                x = jnp.tanh(x @ w)
            return x

        chain = jax.jit(products)

        def step(go: bool) -> bool:
            chain(x, w).block_until_ready()
            return go

        stats = dev.memory_stats() or {}
        # bytes_limit may be the growable pool's cap; pool_bytes (else bytes_reserved) what it took
        memory = {**{k: stats.get(k) for k in ("bytes_limit", "pool_bytes", "bytes_reserved", "bytes_in_use")},
                  "preallocate": os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE", "true (default)"),
                  "mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "default (0.75)")}
        return Built({"matmul": Variant(step, "GFLOP", MATMULS * 2 * N**3 / 1e9)}, memory)

    return build


def cupy_loop(args: argparse.Namespace) -> Callable[[], Built]:
    import cupy as cp

    def build() -> Built:
        kernel = cp.RawKernel(BURN, "burn")
        n = 1 << 22
        x = cp.ones(n, dtype=cp.float32)
        grid, block = ((n + 255) // 256,), (256,)

        def step(go: bool) -> bool:
            for _ in range(LAUNCHES):
                kernel(grid, block, (x, cp.int32(n), cp.int32(2048)))
            cp.cuda.runtime.deviceSynchronize()
            return go

        free, total = cp.cuda.runtime.memGetInfo()
        return Built({"kernels": Variant(step, "kernels", LAUNCHES)}, {"free": int(free), "total": int(total)})

    return build


def sleep_loop(args: argparse.Namespace) -> Callable[[], Built]:
    def build() -> Built:
        def step(go: bool) -> bool:
            time.sleep(0.002)
            return go

        return Built({"sleep": Variant(step, "steps", 1)}, {})

    return build

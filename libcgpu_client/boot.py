"""Start-up hook for Python processes run under ``cgpu-run``.

It parses the environment at once (so a malformed value fails at start,
with a one-line error), chains to any other ``sitecustomize`` on the path,
and installs the PyTorch interposer, which connects to the daemon, the moment
the program imports ``torch`` (not before: importing torch is slow and many
programs never do).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from libcgpu_client.env import EnvError, parse_env

BOOT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot")


class _TorchHook(importlib.abc.MetaPathFinder):
    """Installs the interposer right after ``torch`` finishes importing."""

    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Any:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        real_exec = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            real_exec(module)
            from libcgpu_client.torch import install

            install()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _chain_sitecustomize(own_name: str) -> None:
    """Run the next ``sitecustomize`` on sys.path, which ours shadows."""
    paths = [p for p in sys.path if os.path.abspath(p or ".") != BOOT_DIR]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def boot(own_name: str = "sitecustomize") -> None:
    try:
        env = parse_env()
    except EnvError as exc:
        print(f"cgpu: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    _chain_sitecustomize(own_name)
    if env.disabled:
        return
    if "torch" in sys.modules:
        from libcgpu_client.torch import install

        install()
    else:
        sys.meta_path.insert(0, _TorchHook())

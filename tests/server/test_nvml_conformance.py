"""The daemon's NVML calls are ones nvidia-ml-py exposes, with the argument shapes of the installed release, and
the fake pynvml the tests use answers exactly those (the fake libnvidia-ml.so.1 of cgpu_testing/native is loaded by
the real pynvml in tests/native/test_conformance.py)."""

from __future__ import annotations

import ast
import inspect
from collections import defaultdict
from pathlib import Path

import pytest

pynvml = pytest.importorskip("pynvml")
ROOT = Path(__file__).resolve().parents[2]


def daemon_uses() -> dict[str, set[int]]:
    """Every attribute of pynvml that arbiterd reads, with the positional arities it calls it with."""
    uses: dict[str, set[int]] = defaultdict(set)
    for path in (ROOT / "arbiterd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "pynvml":
                uses.setdefault(node.attr, set())
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "pynvml"):
                assert not node.keywords, f"{path.name}: pynvml.{node.func.attr} with keywords"
                uses[node.func.attr].add(len(node.args))
    return dict(uses)


def test_the_daemon_uses_nvml_through_pynvml() -> None:
    assert {"nvmlInit", "nvmlShutdown", "nvmlDeviceGetMemoryInfo"} <= set(daemon_uses())


def test_every_nvml_call_is_one_nvidia_ml_py_exposes_with_its_argument_shape() -> None:
    for name, arities in daemon_uses().items():
        assert hasattr(pynvml, name), f"pynvml has no {name}"
        target = getattr(pynvml, name)
        if isinstance(target, type):
            assert issubclass(target, Exception), name
            continue
        sig = inspect.signature(target)
        for n in arities:
            sig.bind(*range(n))  # raises TypeError where the daemon's call does not fit the release's signature


def test_the_fake_pynvml_answers_exactly_what_the_daemon_calls() -> None:
    from tests.test_gpu_paths import fake_pynvml

    fake = fake_pynvml()
    offered = {n for n in vars(fake) if n.startswith("nvml") or n == "NVMLError"}
    assert offered == set(daemon_uses())
    for name, arities in daemon_uses().items():
        if not callable(getattr(pynvml, name)) or isinstance(getattr(pynvml, name), type):
            continue
        real, mine = inspect.signature(getattr(pynvml, name)), inspect.signature(getattr(fake, name))
        required = [p for p in real.parameters.values() if p.default is inspect.Parameter.empty]
        assert len(mine.parameters) == len(required), f"{name}: the fake takes {mine}, pynvml {real}"
        for n in arities:
            mine.bind(*range(n))

"""Builds libcgpu.so, the native interposer, as a plain shared library.

Everything else about the package is in pyproject.toml. The extension machinery
is used only to compile and link C sources: the result has no Python module
init, does not link libpython, and is named ``libcgpu.so``.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "libcgpu_client/native"


def shim_sources() -> tuple[str, ...]:
    """The shim's sources, lowest layer first: the one list, ``SHIM_SOURCES`` in libcgpu_client/native/build.py
    (read, not imported: the package is not importable before it is built)."""
    tree = ast.parse(Path(NATIVE, "build.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "SHIM_SOURCES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError(f"{NATIVE}/build.py has no SHIM_SOURCES")


SHIM_SOURCES = shim_sources()
HEADERS = sorted(p.name for p in Path(NATIVE).glob("*.h"))


class BuildSharedLibrary(build_ext):
    def get_ext_filename(self, fullname: str) -> str:
        return os.path.join(*fullname.split(".")) + ".so"

    def get_export_symbols(self, ext: Extension) -> list[str]:
        return []  # no PyInit_*: this is not a Python module

    def get_libraries(self, ext: Extension) -> list[str]:
        return list(ext.libraries)  # never libpython


setup(
    # generated from the tools' parsers by docgen/manpages.py (a test keeps them current)
    data_files=[("share/man/man8", ["man/arbiterd.8", "man/cgpuctl.8", "man/cgpu-device-plugin.8",
                                   "man/cgpu-dra-plugin.8"]),
                ("share/man/man1", ["man/cgpu-smi.1", "man/cgpu-run.1", "man/kubectl-inspect-cgpu.1"])],
    ext_modules=[
        Extension(
            "libcgpu_client.native.libcgpu",
            sources=[f"{NATIVE}/{name}" for name in SHIM_SOURCES],
            depends=[f"{NATIVE}/{name}" for name in HEADERS],
            extra_compile_args=["-std=c11", "-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-Wshadow"],
            libraries=["dl", "pthread"],
        )
    ],
    cmdclass={"build_ext": BuildSharedLibrary},
)

"""Regenerate the Python modules of the vendored kubelet ``.proto`` files.

    python -m cgpu_device_plugin.api.regen [--check]

Runs grpcio-tools' bundled protoc with the repository root as the include path, so the
generated ``*_pb2_grpc.py`` import their messages by absolute package path. ``--check``
writes into a temporary directory and exits 1 if any committed file differs (a test runs it).
The DRA plugin's regen (cgpu_dra_plugin/api/regen.py) runs the same with its own ``.proto`` files.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

API = Path(__file__).resolve().parent
ROOT = API.parent.parent  # the directory holding the cgpu_device_plugin package
PROTOS = [API / "deviceplugin" / "v1beta1" / "api.proto", API / "podresources" / "v1" / "api.proto"]
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_names(proto: Path) -> list[Path]:
    """The files protoc writes for ``proto``, relative to the repository root."""
    rel = proto.relative_to(ROOT)
    return [rel.with_name(rel.stem + suffix) for suffix in SUFFIXES]


def generate(out: Path, protos: list[Path] = PROTOS) -> None:
    """Write the generated modules of ``protos`` under ``out`` (laid out like the repository)."""
    from grpc_tools import protoc  # grpcio-tools: a test/dev dependency, not a runtime one

    for proto in protos:
        args = ["protoc", f"-I{ROOT}", f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}",
                str(proto.relative_to(ROOT))]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")


def differences(protos: list[Path] = PROTOS) -> list[str]:
    """Generated files of ``protos`` whose committed copy differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), protos)
        bad = []
        for proto in protos:
            for rel in generated_names(proto):
                fresh, committed = Path(tmp) / rel, ROOT / rel
                if not committed.exists() or not filecmp.cmp(fresh, committed, shallow=False):
                    bad.append(str(rel))
        return bad


def main(argv: list[str] | None = None, protos: list[Path] = PROTOS,
         prog: str = "python -m cgpu_device_plugin.api.regen", doc: str | None = __doc__) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with the committed files; change nothing")
    args = parser.parse_args(argv)
    if args.check:
        bad = differences(protos)
        for rel in bad:
            print(f"{rel}: differs from what protoc generates; run {prog}")
        return 1 if bad else 0
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), protos)
        for proto in protos:
            for rel in generated_names(proto):
                shutil.copyfile(Path(tmp) / rel, ROOT / rel)
                print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

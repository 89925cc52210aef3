"""Regenerate the Python modules of the vendored kubelet ``.proto`` files (DRA v1 and v1beta1, plugin registration v1).

    python -m cgpu_dra_plugin.api.regen [--check]

The device plugin's regen (cgpu_device_plugin/api/regen.py) over these files: protoc with the repository root
as the include path, so the generated ``*_pb2_grpc.py`` import their messages by absolute package path.
``--check`` writes into a temporary directory and exits 1 if any committed file differs (a test runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

from cgpu_device_plugin.api import regen

API = Path(__file__).resolve().parent
PROTOS = [API / "dra" / "v1" / "api.proto", API / "dra" / "v1beta1" / "api.proto",
          API / "pluginregistration" / "v1" / "api.proto"]


def differences() -> list[str]:
    """Generated files whose committed copy differs from a fresh generation."""
    return regen.differences(PROTOS)


def main(argv: list[str] | None = None) -> int:
    return regen.main(argv, PROTOS, "python -m cgpu_dra_plugin.api.regen", __doc__)


if __name__ == "__main__":
    sys.exit(main())
